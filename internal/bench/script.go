package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"go.uber.org/zap"

	"github.com/gdsfs/gdsfs/gpu"
	"github.com/gdsfs/gdsfs/internal/config"
	"github.com/gdsfs/gdsfs/internal/devices"
	"github.com/gdsfs/gdsfs/scripts"
)

// ScriptOptions are the flags of `gdsfs bench autoload` and `gdsfs bench
// readahead`, which run the H200 scripts of issues 14 and 10.
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

type benchScript struct {
	file, short, doc string
	body             []byte
}

var benchScripts = map[string]benchScript{
	"autoload": {file: "autoload-gpu.py", body: scripts.Autoload,
		short: "Unmodified loaders plain vs under `gdsfs run` (issue 14): scripts/autoload-gpu.py",
		doc: `Runs scripts/autoload-gpu.py (embedded in this binary, or --script) with
--bin set to this binary: safetensors load_file, torch.load and transformers
from_pretrained plain from SOURCE, plain through the mount and under
'gdsfs run', resident and not yet staged, with checksums and logits compared
and its targets (resident >= 20x plain, not slower not staged, mount >= 0.95
SOURCE). It prints a JSON object and a markdown table. It measures loads into
GPU memory: with --set staging.device=host it runs as its dry run (--dry-run:
the same work directory, files, mount, warmup and unmount with a small
torch.save file, its bytes through the mount checked; nothing timed; the CI
tests under python/tests cover the autoloader there), unless --force runs it
all; where no GPU is found and staging.device is not host it fails.
--quick: --size-gib 1 --repeat 1. --set KEY=VALUE goes to the script's
mount too (io.direct_io=auto, say). A target whose cases --cases left out
is reported "not measured"; a measured target that fails, one not checked
(a cold case whose page cache could not be dropped) and a check of the
served calls in which a call fell back make the exit status 1.
Flags after -- go to the script (--size-gib, --repeat, --cases REGEX: only
the cases it names, --work). Needs root, a GPU, torch, safetensors and
transformers. Measured on an H200 (2026-12-01, README "Unmodified
loaders", one run, every target passed): load_file resident 85x plain,
not staged 10.7x (page cache warm) and 1.19x (dropped); plain through the
mount 1.046 of SOURCE warm and 1.02 cold for load_file, 0.989 for
from_pretrained (0.89-1.14 on other starts: single rounds vary by 10%).`},
	"readahead": {file: "readahead-gpu.py", body: scripts.Readahead,
		short: "Read-ahead across files off / on / trace replay (issue 10): scripts/readahead-gpu.py",
		doc: `Runs scripts/readahead-gpu.py (embedded in this binary, or --script) with --bin
set to this binary: a DataLoader over leased shards with nothing resident
and the page cache dropped, read-ahead off, on and replaying a recorded
trace (--workers workers), and one worker that computes on each shard (a
busy wait) as long as the disk takes to read one shard cold, read-ahead off
and on; epoch time, time to first batch, hit ratio, against the disk's cold
read rate and one shard's cold read time measured in the same run. Targets:
computing, epoch on <= 0.65 x off and first batch on <= off; read-ahead on
>= 0.95 x and replay >= 0.9 x the cold read rate. With --set
staging.device=host it runs as its dry run (--device host --no-drop
--dry-run: the targets are not measured here; the checks of the bytes are
made); where no GPU is found and staging.device is not host it fails.
--quick: --shards 64 --shard-mib 1. --set KEY=VALUE goes to the script's
mounts too (under each mode's own keys). Flags after -- go to the script
(--shards, --shard-mib, --workers, --io-threads, --work). Needs root and torch.`},
}

// ScriptShort is the one-line help of `gdsfs bench NAME`.
func ScriptShort(name string) string { return benchScripts[name].short }

// ScriptDoc is the long help of `gdsfs bench NAME`.
func ScriptDoc(name string) string { return benchScripts[name].doc }

// Script runs `gdsfs bench autoload|readahead`: the script's own output
// (JSON, then its table) goes to stdout; its failure is this command's.
func Script(ctx context.Context, o ScriptOptions) error {
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
// (ROOT/scripts/FILE beside ROOT/python), since the scripts find the gdsfs
// package and the test fixtures from where they are.
func writeRepoScript(py *pyEnv, root string, bs benchScript) (string, error) {
	if err := os.MkdirAll(filepath.Join(root, "scripts"), 0o755); err != nil {
		return "", err
	}
	link := filepath.Join(root, "python")
	if err := os.Remove(link); err != nil && !errors.Is(err, os.ErrNotExist) {
		return "", err
	}
	if err := os.Symlink(py.Pkg, link); err != nil {
		return "", err
	}
	path := filepath.Join(root, "scripts", bs.file)
	return path, os.WriteFile(path, bs.body, 0o644)
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
