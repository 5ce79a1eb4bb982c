package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// pyEnv is how the Python helpers run: an interpreter, the directory
// holding the gdsfs package, and a directory the embedded helpers are
// written to.
type pyEnv struct {
	Bin   string // the interpreter
	Pkg   string // directory holding the gdsfs package
	Torch bool   // the interpreter imports torch
	Echo  bool   // runJSON copies the helper's stderr (its progress) to ours as it comes
	dir   string
}

// PyFlags are the Python flags shared by the benchmarks.
type PyFlags struct {
	Bin string // interpreter; "" picks python3, else /usr/bin/python3, preferring one with torch
	Pkg string // directory holding the gdsfs package; "" is python/ of the repository the binary sits in
}

// newPyEnv resolves f. wantTorch prefers an interpreter that imports torch
// (it is required by the caller's own check, not here).
func newPyEnv(f PyFlags, dir string, wantTorch bool) (*pyEnv, error) {
	p := &pyEnv{Bin: f.Bin, Pkg: f.Pkg, dir: dir}
	if p.Pkg == "" {
		p.Pkg = defaultPkg()
	}
	if p.Pkg == "" {
		return nil, fmt.Errorf("no gdsfs Python package found beside the binary or in ./python (--python)")
	}
	if _, err := os.Stat(filepath.Join(p.Pkg, "gdsfs", "__init__.py")); err != nil {
		return nil, fmt.Errorf("--python %s: no gdsfs package there", p.Pkg)
	}
	if p.Bin == "" {
		p.Bin = pickInterpreter(wantTorch)
	}
	if _, err := exec.LookPath(p.Bin); err != nil {
		return nil, fmt.Errorf("--python-bin %s: %w", p.Bin, err)
	}
	p.Torch = exec.Command(p.Bin, "-c", "import torch").Run() == nil
	return p, os.MkdirAll(dir, 0o700)
}

// defaultPkg is python/ of the repository the binary was built into
// (bin/ or .bin/), else ./python.
func defaultPkg() string {
	var cands []string
	if exe, err := os.Executable(); err == nil {
		cands = append(cands, filepath.Join(filepath.Dir(exe), "..", "python"))
	}
	if wd, err := os.Getwd(); err == nil {
		cands = append(cands, filepath.Join(wd, "python"))
	}
	for _, c := range cands {
		if _, err := os.Stat(filepath.Join(c, "gdsfs", "__init__.py")); err == nil {
			abs, _ := filepath.Abs(c)
			return abs
		}
	}
	return ""
}

// pickInterpreter is python3, or /usr/bin/python3 where only that one
// imports torch and torch is wanted.
func pickInterpreter(wantTorch bool) string {
	cands := []string{"python3", "/usr/bin/python3"}
	if wantTorch {
		for _, c := range cands {
			if exec.Command(c, "-c", "import torch").Run() == nil {
				return c
			}
		}
	}
	return cands[0]
}

// write puts an embedded helper in the helper directory.
func (p *pyEnv) write(name string, body []byte) (string, error) {
	path := filepath.Join(p.dir, name)
	return path, writeNew(path, body, 0o644)
}

// command is the interpreter running script with args, the gdsfs package
// first on its path, unbuffered.
func (p *pyEnv) command(ctx context.Context, script string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, p.Bin, append([]string{script}, args...)...)
	env := []string{"PYTHONUNBUFFERED=1", "PYTHONDONTWRITEBYTECODE=1", "PYTHONPATH=" + p.Pkg + pathSuffix(os.Getenv("PYTHONPATH"))}
	cmd.Env = append(os.Environ(), env...)
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

func pathSuffix(s string) string {
	if s == "" {
		return ""
	}
	return string(os.PathListSeparator) + s
}

// runJSON runs script and decodes its last JSON line into v. stderr is
// kept for the error (and copied to ours with Echo); limit bounds the run.
func (p *pyEnv) runJSON(ctx context.Context, limit time.Duration, v any, script string, args ...string) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	cmd := p.command(ctx, script, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if p.Echo {
		cmd.Stderr = io.MultiWriter(&stderr, os.Stderr)
	}
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (limit %v)", ctx.Err(), limit)
		}
		return fmt.Errorf("%s %s: %v: %s", filepath.Base(p.Bin), filepath.Base(script), err, lastLines(stderr.String()+stdout.String(), 6))
	}
	if err := lastJSONLine(stdout.Bytes(), v); err != nil {
		return fmt.Errorf("%s: %w (stderr: %s)", filepath.Base(script), err, lastLines(stderr.String(), 4))
	}
	return nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}
