package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/gdsfs/gdsfs/client"
	"github.com/gdsfs/gdsfs/internal/control"
	"github.com/gdsfs/gdsfs/internal/mountinfo"
	"github.com/gdsfs/gdsfs/proto"
	"github.com/gdsfs/gdsfs/staging"
)

func warmupCmd() *cobra.Command {
	var wait bool
	var timeout time.Duration
	var trace, gpus string
	c := &cobra.Command{
		Use:   "warmup [--wait] [--gpus all|0,1|GPU-...] PATH... | warmup --trace FILE [--wait] [MOUNTPOINT]",
		Short: "Stage files (directories: every file under them) of a gdsfs mount",
		Long: `Writes each file to its mount's .gdsfs/prefetch. With --wait it waits until
each is resident or failed (a progress bar on a terminal) and exits non-zero
if any failed, naming why.

--gpus stages a replica of each file on every device named: ordinals of the
mount's staging.gpus, device names (GPU-<uuid>, hostN) or all, comma
separated (the prefetch line "PATH<TAB>gpus=LIST"). A file staged on none of
them is read once from SOURCE: each GPU reads a share over its own host link
and the GPUs exchange the rest device to device (split ingest, where the GPUs
have peer access). With --wait, every replica named must end resident.

With --trace FILE (a trace as MOUNTPOINT/.gdsfs/trace writes it) it writes
the trace's paths to the mount's .gdsfs/replay instead: they are staged in
the trace's order, staging.readahead_files at a time, as far as the cache
has room. MOUNTPOINT defaults to the trace's "# mount:". A path the caller
may not read fails alone; failures are named and the exit status is
non-zero.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if trace != "" {
				return traceArgs(args)
			}
			if len(args) == 0 {
				return usageError{errors.New("warmup: want at least one PATH under a gdsfs mount")}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if trace != "" {
				if cmd.Flags().Changed("gpus") {
					return usageError{errors.New("warmup: --trace and --gpus do not go together")}
				}
				return warmupTrace(trace, args, wait, timeout)
			}
			var devs []string
			if cmd.Flags().Changed("gpus") {
				var err error
				if devs, err = staging.ParseDevices(gpus); err != nil {
					return usageError{fmt.Errorf("--gpus: %w", err)}
				}
			}
			files, err := warmupFiles(args)
			if err != nil {
				return err
			}
			for _, f := range files {
				if err := prefetchOne(f, devs); err != nil {
					return err
				}
			}
			if !wait {
				fmt.Fprintf(os.Stderr, "queued %d files\n", len(files))
				return nil
			}
			if err := waitStaged(files, timeout); err != nil {
				return err
			}
			return checkReplicas(files, devs)
		},
	}
	c.Flags().BoolVar(&wait, "wait", false, "wait until every file is resident or failed")
	c.Flags().DurationVar(&timeout, "timeout", 10*time.Minute, "longest --wait waits")
	c.Flags().StringVar(&trace, "trace", "", "stage the paths of this trace file in its order (.gdsfs/replay)")
	c.Flags().StringVar(&gpus, "gpus", "", "stage a replica on each of these devices: all, or ordinals / names, comma separated")
	return c
}

// warmFile is one file to stage: its path, mount and size.
type warmFile struct {
	path, mnt, rel string
	size           int64
}

func warmupFiles(args []string) ([]warmFile, error) {
	var out []warmFile
	for _, a := range args {
		mnt, _, err := mountinfo.Root(a)
		if err != nil {
			return nil, err
		}
		err = filepath.WalkDir(a, func(p string, d fs.DirEntry, err error) error {
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
	var pe *fs.PathError
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
