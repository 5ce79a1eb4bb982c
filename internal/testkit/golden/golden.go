// Package golden reads the lease protocol's transcripts
// (proto/testdata/*.jsonl, described in proto/PROTOCOL.md) for the tests
// that replay them: the server's against a real daemon, the Go client's
// against a fake daemon that answers from the transcript. The Python
// client's tests (python/tests) read the same files with the same rules.
package golden

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Setup is a transcript's first line: the SOURCE tree and the daemon's
// settings.
type Setup struct {
	Files         map[string]File `json:"files"`
	Dirs          []string        `json:"dirs"`
	FIFOs         []string        `json:"fifos"`
	Sharing       string          `json:"sharing"`
	ChunkSize     int64           `json:"chunk_size"`
	MaxRequest    int64           `json:"max_request"`
	CacheHeadroom string          `json:"cache_headroom"`
	// HostDevices: the daemon stages onto this many host devices,
	// host0 .. hostN-1 (0: one, "host").
	HostDevices int `json:"host_devices"`
}

// File is a file's content: Size bytes of Content(Seed).
type File struct {
	Size int64 `json:"size"`
	Seed int   `json:"seed"`
}

// Step is one line after the setup.
type Step struct {
	Line int `json:"-"`
	// Step is "connect" (a new connection; later exchanges use it),
	// "change" (rewrite File in SOURCE with Size/Seed, a new mtime) or ""
	// for an exchange.
	Step string `json:"step"`
	File string `json:"file"`
	Size int64  `json:"size"`
	Seed int    `json:"seed"`
	// An exchange: a request (Send, or SendRaw bytes as they are), the
	// answer pattern and how many descriptors ride with it.
	Send    map[string]any `json:"send"`
	SendRaw string         `json:"send_raw"`
	Expect  map[string]any `json:"expect"`
	FDs     int            `json:"fds"`
	// Closed: after the answer the daemon closes the connection.
	Closed bool `json:"closed"`
	// Client is the client call that makes this request ("open a.bin",
	// "close a.bin", "open_many a.bin b.bin", "stat a.bin", "wait a.bin
	// resident,failed 5000" (states, timeout in ms), "wait_stat
	// leases_active 1 5000" (key, value, timeout in ms); a last word
	// device=D asks for the lease on D, and names the lease for its close:
	// "open a.bin device=host1", "close a.bin device=host1"); exchanges and
	// connects with ServerOnly are skipped by client replays.
	Client     string `json:"client"`
	ServerOnly bool   `json:"server_only"`
	// ClientErr: the client call fails with this errno.
	ClientErr string `json:"client_err"`
}

// Transcript is one file of proto/testdata.
type Transcript struct {
	Name  string
	Setup Setup
	Steps []Step
}

// Dir is proto/testdata relative to a package directory of the module.
func Dir() string {
	for _, d := range []string{"../proto/testdata", "../../proto/testdata", "proto/testdata"} {
		if _, err := os.Stat(d); err == nil {
			return d
		}
	}
	return "../proto/testdata"
}

// Load reads every transcript in dir.
func Load(dir string) ([]Transcript, error) {
	names, err := filepath.Glob(filepath.Join(dir, "*.jsonl"))
	if err != nil || len(names) == 0 {
		return nil, fmt.Errorf("no transcripts in %s (%v)", dir, err)
	}
	sort.Strings(names)
	var out []Transcript
	for _, n := range names {
		t, err := parse(n)
		if err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return out, nil
}

func parse(name string) (Transcript, error) {
	b, err := os.ReadFile(name)
	if err != nil {
		return Transcript{}, err
	}
	t := Transcript{Name: strings.TrimSuffix(filepath.Base(name), ".jsonl")}
	s := bufio.NewScanner(bytes.NewReader(b))
	s.Buffer(make([]byte, 1<<20), 1<<20)
	first := true
	for n := 1; s.Scan(); n++ {
		line := bytes.TrimSpace(s.Bytes())
		if len(line) == 0 || line[0] == '#' {
			continue
		}
		if first {
			var w struct {
				Setup *Setup `json:"setup"`
			}
			if err := json.Unmarshal(line, &w); err != nil || w.Setup == nil {
				return t, fmt.Errorf("%s:%d: the first line must be {\"setup\": ...} (%v)", name, n, err)
			}
			t.Setup, first = *w.Setup, false
			continue
		}
		var st Step
		dec := json.NewDecoder(bytes.NewReader(line))
		dec.DisallowUnknownFields()
		dec.UseNumber()
		if err := dec.Decode(&st); err != nil {
			return t, fmt.Errorf("%s:%d: %v", name, n, err)
		}
		st.Line = n
		t.Steps = append(t.Steps, st)
	}
	return t, s.Err()
}

// Content is the bytes of a transcript file: byte i of seed s is
// (7i + i>>8 + 31s) mod 256.
func Content(seed int, n int64) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(int64(i)*7 + int64(i)>>8 + int64(seed)*31)
	}
	return b
}

// Bindings are the values patterns bound: "$epoch" and each "$id:NAME".
type Bindings map[string]any

// Match checks an actual answer (decoded with UseNumber) against a
// pattern: the same keys; literal values equal; "$text" any non-empty
// string; "$epoch" and "$id:NAME" a positive integer, bound on first use
// and equal after.
func Match(pattern, actual any, b Bindings, where string) error {
	switch p := pattern.(type) {
	case map[string]any:
		a, ok := actual.(map[string]any)
		if !ok {
			return fmt.Errorf("%s: want an object, got %v", where, actual)
		}
		for k := range a {
			if _, ok := p[k]; !ok {
				return fmt.Errorf("%s: unexpected key %q (= %v)", where, k, a[k])
			}
		}
		for k, pv := range p {
			av, ok := a[k]
			if !ok {
				return fmt.Errorf("%s: missing key %q", where, k)
			}
			if err := Match(pv, av, b, where+"."+k); err != nil {
				return err
			}
		}
		return nil
	case []any:
		a, ok := actual.([]any)
		if !ok || len(a) != len(p) {
			return fmt.Errorf("%s: want %d items, got %v", where, len(p), actual)
		}
		for i := range p {
			if err := Match(p[i], a[i], b, fmt.Sprintf("%s[%d]", where, i)); err != nil {
				return err
			}
		}
		return nil
	case string:
		if p == "$text" {
			if s, ok := actual.(string); ok && s != "" {
				return nil
			}
			return fmt.Errorf("%s: want a non-empty string, got %v", where, actual)
		}
		if name, ok := binding(p); ok {
			n, ok := actual.(json.Number)
			if !ok || strings.HasPrefix(n.String(), "-") || n.String() == "0" || strings.ContainsAny(n.String(), ".eE") {
				return fmt.Errorf("%s: want a positive integer for %s, got %v", where, p, actual)
			}
			if prev, ok := b[name]; ok && prev.(json.Number) != n {
				return fmt.Errorf("%s: %s was %v, now %v", where, p, prev, n)
			}
			b[name] = n
			return nil
		}
	}
	pj, _ := json.Marshal(pattern)
	aj, _ := json.Marshal(actual)
	if !bytes.Equal(pj, aj) {
		return fmt.Errorf("%s: want %s, got %s", where, pj, aj)
	}
	return nil
}

func binding(s string) (string, bool) {
	if s == "$epoch" {
		return s, true
	}
	if rest, ok := strings.CutPrefix(s, "$id:"); ok && rest != "" {
		return s, true
	}
	return "", false
}

// Fill replaces the bound patterns in a request (or, for a fake daemon,
// in an answer pattern: unbound ids get fresh numbers, "$text" becomes
// "text"). next numbers fresh ids.
func Fill(v any, b Bindings, next *int64) any {
	switch x := v.(type) {
	case map[string]any:
		out := map[string]any{}
		for k, e := range x {
			out[k] = Fill(e, b, next)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = Fill(e, b, next)
		}
		return out
	case string:
		if x == "$text" {
			return "text"
		}
		if name, ok := binding(x); ok {
			if v, ok := b[name]; ok {
				return v
			}
			*next++
			n := json.Number(fmt.Sprint(*next))
			b[name] = n
			return n
		}
	}
	return v
}

// Decode parses a JSON line keeping numbers exact.
func Decode(line []byte) (map[string]any, error) {
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		return nil, err
	}
	return m, nil
}

// Paths lists the file paths a request names ("path", or "paths").
func Paths(req map[string]any) []string {
	if p, ok := req["path"].(string); ok {
		return []string{p}
	}
	var out []string
	if ps, ok := req["paths"].([]any); ok {
		for _, p := range ps {
			s, _ := p.(string)
			out = append(out, s)
		}
	}
	return out
}
