// Package config loads gdsfs configuration: the embedded config.yaml, then an
// optional file, then --set key=value overrides. Every key is checked against
// the typed sections below; an unknown key or a bad value is one error line
// naming the dotted key. It never corrects a value silently.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/gdsfs/gdsfs"
	"github.com/gdsfs/gdsfs/fs"
	"github.com/gdsfs/gdsfs/internal/metrics"
	"github.com/gdsfs/gdsfs/ipc"
	"github.com/gdsfs/gdsfs/staging"
)

// Log is the log section.
type Log struct {
	Level  string `yaml:"level"`
	Format string `yaml:"format"`
	File   string `yaml:"file"` // "" is stderr
}

// Shutdown is the shutdown section: how a stopping daemon treats files
// still open, and what it does once a successor took its mount over.
type Shutdown struct {
	Grace time.Duration `yaml:"grace"`
	// AfterHandover is "exit" (exit 0 at once) or "wait" (wait for
	// SIGTERM or SIGINT, then exit 0 touching nothing: for a container
	// whose exit would be restarted).
	AfterHandover string `yaml:"after_handover"`
	// HandoverTimeout bounds how long the mount waits, stopped, for a
	// successor to adopt what it was handed; then this daemon serves on.
	HandoverTimeout time.Duration `yaml:"handover_timeout"`
}

// Config is the whole configuration, one field per section of config.yaml.
type Config struct {
	Log      Log               `yaml:"log"`
	FUSE     fs.Options        `yaml:"fuse"`
	Staging  staging.Options   `yaml:"staging"`
	IO       staging.IOOptions `yaml:"io"`
	IPC      ipc.Options       `yaml:"ipc"`
	Metrics  metrics.Options   `yaml:"metrics"`
	Shutdown Shutdown          `yaml:"shutdown"`
}

// Load builds the configuration: defaults, then file (if not empty), then
// each "key=value" of sets in order. The result is validated.
func Load(file string, sets []string) (*Config, error) {
	c, err := Default()
	if err != nil {
		return nil, err
	}
	if file != "" {
		data, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("config: %w", err)
		}
		if err := apply(c, data); err != nil {
			return nil, fmt.Errorf("config %s: %w", file, err)
		}
	}
	for _, s := range sets {
		if err := c.Set(s); err != nil {
			return nil, err
		}
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c, nil
}

// Default returns the embedded config.yaml, unvalidated.
func Default() (*Config, error) {
	c := &Config{}
	if err := apply(c, gdsfs.DefaultConfig); err != nil {
		return nil, fmt.Errorf("embedded config.yaml: %w", err)
	}
	return c, nil
}

// Set applies one "dotted.key=value" override; value is YAML ("2GiB",
// "[0,1]", "true").
func (c *Config) Set(kv string) error {
	key, value, ok := strings.Cut(kv, "=")
	key = strings.TrimSpace(key)
	if !ok || key == "" {
		return fmt.Errorf("--set %q: want key=value, e.g. staging.capacity=2GiB", kv)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal([]byte(value), &doc); err != nil {
		return fmt.Errorf("--set %s: value %q is not valid YAML", key, value)
	}
	node := &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: ""}
	if len(doc.Content) > 0 {
		node = doc.Content[0]
	}
	field, err := lookup(reflect.ValueOf(c).Elem(), strings.Split(key, "."), "")
	if err != nil {
		return fmt.Errorf("--set %s: %w", key, err)
	}
	if isSection(field.Type()) {
		return fmt.Errorf("--set %s: %s is a section; set one of its keys: %s", key, key, keysOf(field.Type()))
	}
	if err := decodeLeaf(node, field, key); err != nil {
		return fmt.Errorf("--set %w", err)
	}
	return nil
}

// Validate checks every section.
func (c *Config) Validate() error {
	switch c.Log.Level {
	case "debug", "info", "warn", "error":
	default:
		return fmt.Errorf("log.level: %q is not one of debug, info, warn, error", c.Log.Level)
	}
	switch c.Log.Format {
	case "auto", "console", "json":
	default:
		return fmt.Errorf("log.format: %q is not one of auto, console, json", c.Log.Format)
	}
	if c.Log.File != "" && !filepath.IsAbs(c.Log.File) {
		return fmt.Errorf("log.file: %q is not an absolute path", c.Log.File)
	}
	if c.Shutdown.Grace < 0 {
		return fmt.Errorf("shutdown.grace: %s is negative", c.Shutdown.Grace)
	}
	if c.Shutdown.HandoverTimeout <= 0 {
		return fmt.Errorf("shutdown.handover_timeout: %s is not positive", c.Shutdown.HandoverTimeout)
	}
	switch c.Shutdown.AfterHandover {
	case "exit", "wait":
	default:
		return fmt.Errorf("shutdown.after_handover: %q is not one of exit, wait", c.Shutdown.AfterHandover)
	}
	for _, err := range []error{c.FUSE.Validate(), c.Staging.Validate(), c.IO.Validate(), c.IPC.Validate(), c.Metrics.Validate()} {
		if err != nil {
			return err
		}
	}
	return nil
}

// YAML prints the effective configuration.
func (c *Config) YAML() []byte {
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(c); err != nil {
		return []byte("# cannot print the configuration: " + err.Error() + "\n")
	}
	return b.Bytes()
}

// apply decodes a YAML document onto c, key by key.
func apply(c *Config, data []byte) error {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return fmt.Errorf("not valid YAML: %s", firstLine(err.Error()))
	}
	if len(doc.Content) == 0 {
		return nil // empty file: nothing to override
	}
	return applyMapping(doc.Content[0], reflect.ValueOf(c).Elem(), "")
}

var unmarshalerType = reflect.TypeFor[yaml.Unmarshaler]()

// isSection reports whether t is a struct whose keys are config keys (not a
// value type with its own YAML form, such as units.Share).
func isSection(t reflect.Type) bool {
	return t.Kind() == reflect.Struct && !reflect.PointerTo(t).Implements(unmarshalerType)
}

func applyMapping(n *yaml.Node, v reflect.Value, prefix string) error {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil // "section:" with nothing under it
	}
	if n.Kind != yaml.MappingNode {
		return fmt.Errorf("%s: want a mapping of keys (%s)", strings.TrimSuffix(prefix, "."), keysOf(v.Type()))
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		key := n.Content[i].Value
		field, err := lookup(v, []string{key}, prefix)
		if err != nil {
			return err
		}
		if isSection(field.Type()) {
			err = applyMapping(n.Content[i+1], field, prefix+key+".")
		} else {
			err = decodeLeaf(n.Content[i+1], field, prefix+key)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// lookup finds the field (a section or a value) at path under v; prefix
// names v for errors.
func lookup(v reflect.Value, path []string, prefix string) (reflect.Value, error) {
	for i, name := range path {
		if !isSection(v.Type()) {
			return reflect.Value{}, fmt.Errorf("unknown key %s%s", prefix, strings.Join(path, "."))
		}
		f, ok := fieldByTag(v, name)
		if !ok {
			return reflect.Value{}, fmt.Errorf("unknown key %s%s (known under %s: %s)",
				prefix, strings.Join(path[:i+1], "."), orTop(strings.TrimSuffix(prefix+strings.Join(path[:i], "."), ".")), keysOf(v.Type()))
		}
		v = f
	}
	return v, nil
}

func fieldByTag(v reflect.Value, name string) (reflect.Value, bool) {
	t := v.Type()
	for i := range t.NumField() {
		if tag, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ","); tag == name {
			return v.Field(i), true
		}
	}
	return reflect.Value{}, false
}

func keysOf(t reflect.Type) string {
	var keys []string
	for i := range t.NumField() {
		tag, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
		keys = append(keys, tag)
	}
	slices.Sort(keys)
	return strings.Join(keys, ", ")
}

func orTop(s string) string {
	if s == "" {
		return "the top level"
	}
	return s
}

// decodeLeaf decodes n into field, replacing its value (lists are replaced,
// not merged). Errors are one line naming key.
func decodeLeaf(n *yaml.Node, field reflect.Value, key string) error {
	fresh := reflect.New(field.Type())
	if err := n.Decode(fresh.Interface()); err != nil {
		return fmt.Errorf("%s: %s", key, leafError(err, n, field.Type()))
	}
	field.Set(fresh.Elem())
	return nil
}

func leafError(err error, n *yaml.Node, t reflect.Type) string {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		return firstLine(err.Error())
	}
	want := t.Kind().String()
	switch {
	case t.String() == "time.Duration":
		want = "duration such as 30s"
	case t.Kind() == reflect.Slice:
		want = "list of " + t.Elem().Kind().String()
	case t.Kind() == reflect.Int:
		want = "whole number"
	}
	got := n.Value
	if n.Kind != yaml.ScalarNode {
		got = "a " + map[yaml.Kind]string{yaml.MappingNode: "mapping", yaml.SequenceNode: "list"}[n.Kind]
	} else {
		got = fmt.Sprintf("%q", got)
	}
	return fmt.Sprintf("want a %s, got %s", want, got)
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimPrefix(s, "yaml: "), "\n")
	return s
}
