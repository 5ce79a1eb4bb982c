package bench

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"go.uber.org/zap"

	"github.com/gdsfs/gdsfs/daemon/config"
	"github.com/gdsfs/gdsfs/gpu"
	"github.com/gdsfs/gdsfs/internal/devices"
	"github.com/gdsfs/gdsfs/scripts"
)

// ScriptOptions are the flags of `gdsfs bench autoload` and `gdsfs bench
// readahead`, which run scripts/autoload-gpu.py and
// scripts/readahead-gpu.py.
type ScriptOptions struct {
	Name   string // autoload or readahead
	Script string // "" runs the embedded copy
	Quick  bool
	Force  bool // run autoload although the device is the host backend
	Dir    string
	Py     PyFlags
	Sets   []string // decide the device (staging.device)
	Args   []string // passed to the script after the flags made here
}

//go:embed script_autoload.md
var scriptAutoloadHelp string

//go:embed script_readahead.md
var scriptReadaheadHelp string

type benchScript struct {
	file, short, doc string
	body             []byte
}

var benchScripts = map[string]benchScript{
	"autoload": {file: "autoload-gpu.py", body: scripts.Autoload,
		short: "Unmodified loaders plain vs under `gdsfs run`: scripts/autoload-gpu.py",
		doc:   scriptAutoloadHelp},
	"readahead": {file: "readahead-gpu.py", body: scripts.Readahead,
		short: "Read-ahead across files off / on / trace replay: scripts/readahead-gpu.py",
		doc:   scriptReadaheadHelp},
}

// ScriptShort is the one-line help of `gdsfs bench NAME`.
func ScriptShort(name string) string { return benchScripts[name].short }

// ScriptDoc is the long help of `gdsfs bench NAME`.
func ScriptDoc(name string) string { return benchScripts[name].doc }

// Script runs `gdsfs bench autoload|readahead`: the script's own output
// (JSON, then its table) goes to stdout; its failure is this command's.
func Script(ctx context.Context, o ScriptOptions) error {
	if err := openWorkDir("--dir", o.Dir); err != nil {
		return err
	}
	bs, ok := benchScripts[o.Name]
	if !ok {
		return fmt.Errorf("no bench script %q", o.Name)
	}
	host, err := hostBackend(o.Sets)
	if err != nil {
		return err
	}
	if host && !o.Force && !hostChosen(o.Sets) {
		return fmt.Errorf("%s: %s; --set staging.device=host runs the dry run", bs.file, whyNoGPU)
	}
	py, err := newPyEnv(o.Py, filepath.Join(o.Dir, "py"), true)
	if err != nil {
		return err
	}
	path := o.Script
	if path == "" {
		if path, err = writeRepoScript(py, filepath.Join(o.Dir, "py", "repo"), bs); err != nil {
			return err
		}
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	args := append([]string{"--bin", exe, "--work", filepath.Join(o.Dir, o.Name)}, scriptArgs(o, py, host)...)
	cmd := py.command(ctx, path, append(args, o.Args...)...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	fmt.Fprintf(os.Stderr, "gdsfs bench %s: %s %s %v\n", o.Name, py.Bin, path, args)
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s: %w", bs.file, err)
	}
	return nil
}

// scriptArgs are the flags made here for the script.
func scriptArgs(o ScriptOptions, py *pyEnv, host bool) []string {
	var args []string
	switch o.Name {
	case "autoload":
		if host && !o.Force {
			args = append(args, "--dry-run")
		}
		if o.Quick {
			args = append(args, "--size-gib", "1", "--repeat", "1")
		}
	case "readahead":
		args = append(args, "--python", py.Bin)
		if host {
			args = append(args, "--device", "host", "--no-drop", "--dry-run")
		}
		if o.Quick {
			// 64 shards: in a directory of 16 the detector allows
			// readers only n/8 = 2 files apart, and 4 workers with 2
			// batches each in flight are 8 apart, so it never engages.
			args = append(args, "--shards", "64", "--shard-mib", "1")
		}
	}
	for _, kv := range o.Sets { // the script's mounts get them too
		args = append(args, "--set", kv)
	}
	return args
}

// writeRepoScript lays the embedded script out as in the repository
// (ROOT/scripts/FILE beside ROOT/python, with the gpuscript.py it imports),
// since the scripts find the gdsfs package and the test fixtures from where
// they are.
func writeRepoScript(py *pyEnv, root string, bs benchScript) (string, error) {
	if err := os.MkdirAll(filepath.Join(root, "scripts"), 0o700); err != nil {
		return "", err
	}
	link := filepath.Join(root, "python")
	if err := os.Remove(link); err != nil && !errors.Is(err, os.ErrNotExist) {
		return "", err
	}
	if err := os.Symlink(py.Pkg, link); err != nil {
		return "", err
	}
	if err := writeNew(filepath.Join(root, "scripts", "gpuscript.py"), scripts.Shared, 0o644); err != nil {
		return "", err
	}
	path := filepath.Join(root, "scripts", bs.file)
	return path, writeNew(path, bs.body, 0o644)
}

// hostBackend reports whether a mount with sets would stage on the host
// backend (staging.device=host, or auto where no GPU answers).
func hostBackend(sets []string) (bool, error) {
	cfg, err := config.Load("", sets)
	if err != nil {
		return false, err
	}
	devs, err := devices.Open(cfg.Staging, zap.NewNop())
	if err != nil {
		return false, err
	}
	defer devices.Close(devs)
	return devs[0].Kind() != gpu.KindCUDA, nil
}
