package daemon

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"

	"github.com/gdsfs/gdsfs/client"
	"github.com/gdsfs/gdsfs/internal/control"
	"github.com/gdsfs/gdsfs/internal/mountinfo"
	"github.com/gdsfs/gdsfs/proto"
	"github.com/gdsfs/gdsfs/staging"
)

// WarmupOptions say how Warmup stages.
type WarmupOptions struct {
	// GPUs, when set, names the devices that each get a replica (as
	// ParseGPUs reads them: the prefetch line "PATH<TAB>gpus=LIST").
	GPUs []string
	// Wait waits until every file is resident or failed, and fails if any
	// failed.
	Wait    bool
	Timeout time.Duration // longest Wait waits
}

// ParseGPUs reads a device list: ordinals of the mount's staging.gpus,
// device names (GPU-<uuid>, hostN) or all, comma separated.
func ParseGPUs(list string) ([]string, error) {
	devs, err := staging.ParseDevices(list)
	if err != nil {
		return nil, UsageError{fmt.Errorf("--gpus: %w", err)}
	}
	return devs, nil
}

// Warmup writes each file under paths to its mount's .gdsfs/prefetch
// and, with o.Wait, waits for them (a progress bar on a terminal's
// stderr).
func Warmup(paths []string, o WarmupOptions) error {
	devs := o.GPUs
	files, err := warmupFiles(paths)
	if err != nil {
		return err
	}
	for _, f := range files {
		if err := prefetchOne(f, devs); err != nil {
			return err
		}
	}
	if !o.Wait {
		fmt.Fprintf(os.Stderr, "queued %d files\n", len(files))
		return nil
	}
	if err := waitStaged(files, o.Timeout); err != nil {
		return err
	}
	return checkReplicas(files, devs)
}

// warmFile is one file to stage: its path, mount and size.
type warmFile struct {
	path, mnt, rel string
	size           int64
}

// warmupFiles lists the regular files under args. A file whose name is
// not UTF-8 is named on stderr and left out: a wait request cannot name
// it, nor cache.json list it (JSON would give it U+FFFD for its bad
// bytes, the name of another file).
func warmupFiles(args []string) ([]warmFile, error) {
	var out []warmFile
	for _, a := range args {
		mnt, _, err := mountinfo.Root(a)
		if err != nil {
			return nil, err
		}
		err = filepath.WalkDir(a, func(p string, d os.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.Name() == ".gdsfs" && d.IsDir() {
				return filepath.SkipDir
			}
			if !d.Type().IsRegular() {
				return nil
			}
			info, err := d.Info()
			if err != nil {
				return err
			}
			_, rel, err := mountinfo.Root(p)
			if err != nil {
				return err
			}
			if !utf8.ValidString(rel) {
				fmt.Fprintf(os.Stderr, "warmup: skipping %q: its name is not UTF-8, which the lease protocol and cache.json cannot name\n", p)
				return nil
			}
			out = append(out, warmFile{path: p, mnt: mnt, rel: rel, size: info.Size()})
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("warmup %s: %w", a, err)
		}
	}
	return out, nil
}

// prefetchOne writes f to its mount's .gdsfs/prefetch, with the devices
// (none: where staging puts it).
func prefetchOne(f warmFile, devs []string) error {
	ctl, err := control.OpenWriter(filepath.Join(f.mnt, ".gdsfs", "prefetch"))
	if err != nil {
		return fmt.Errorf("%s: %w", f.mnt, err)
	}
	line := f.rel
	if len(devs) > 0 {
		line += "\tgpus=" + strings.Join(devs, ",")
	}
	_, err = ctl.WriteString(line + "\n")
	if cerr := ctl.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("warmup %s: %w", f.path, unwrapSyscall(err))
	}
	return nil
}

func unwrapSyscall(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// waitStaged waits until each file is resident, failed or absent
// (dropped from the queue, or evicted to make room), through the daemon's
// wait request: it answers when the file's state changes, nothing is
// polled. Files are waited for in turn, on one connection per mount.
func waitStaged(files []warmFile, timeout time.Duration) error {
	var total int64
	for _, f := range files {
		total += f.size
	}
	bar := progressbar.DefaultBytesSilent(total, "staging")
	if term.IsTerminal(int(os.Stderr.Fd())) {
		bar = progressbar.DefaultBytes(total, "staging")
	}
	conns := map[string]*client.Conn{}
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	var failed []string
	deadline := time.Now().Add(timeout)
	for i, f := range files {
		r, err := waitOne(conns, f, time.Until(deadline))
		switch {
		case errors.Is(err, syscall.ETIMEDOUT):
			return fmt.Errorf("warmup: %d files still loading after %s", len(files)-i, timeout)
		case err != nil:
			return fmt.Errorf("warmup %s: %w", f.path, err)
		case r.State != proto.StateResident:
			what := f.rel + ": " + r.State
			if r.Why != "" {
				what += " (" + r.Why + ")"
			}
			failed = append(failed, what)
		}
		bar.Add64(f.size)
	}
	bar.Finish()
	fmt.Fprintln(os.Stderr)
	if len(failed) > 0 {
		return fmt.Errorf("warmup: %d of %d files not staged: %s", len(failed), len(files), strings.Join(failed, "; "))
	}
	fmt.Fprintf(os.Stderr, "%d files resident\n", len(files))
	return nil
}

// waitOne waits (at most left) until f is resident, failed or absent, on
// its daemon's connection in conns (made on first use).
func waitOne(conns map[string]*client.Conn, f warmFile, left time.Duration) (proto.Response, error) {
	sock, rel, err := client.Locate(f.path)
	if err != nil {
		return proto.Response{}, err
	}
	c := conns[sock]
	if c == nil {
		if c, rel, err = client.DialMount(f.path); err != nil {
			return proto.Response{}, err
		}
		conns[sock] = c
	}
	return c.Wait(rel, []string{proto.StateResident, proto.StateFailed, proto.StateAbsent}, left)
}
