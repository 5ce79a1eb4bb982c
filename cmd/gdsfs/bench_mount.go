package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/gdsfs/gdsfs/internal/units"
)

// Layout of the bench directory: SOURCE is DIR/source, with the big file
// and --files small files in SOURCE/many; each mount gets DIR/mnt-KEY.
const (
	mbBigName   = "big.bin"
	mbManyDir   = "many"
	mbSmallSize = 1 << 10
	mbReadBlock = 1 << 20
)

// mountBenchOptions are the flags of `gdsfs bench mount`.
type mountBenchOptions struct {
	size     units.Size
	files    int
	runs     int
	dir      string
	loopback string // go-fuse example/loopback binary; "" if none was found
	json     bool
}

func benchMountCmd() *cobra.Command {
	var o mountBenchOptions
	var size string
	c := &cobra.Command{
		Use:   "mount [--size 1GiB] [--files 10000] [--runs 5] [--dir DIR] [--loopback BINARY] [--json]",
		Short: "Read throughput and stat rate: native vs gdsfs vs go-fuse loopback",
		Long: `Measures, in one run and on the same files, sequential read throughput of one
big file (page cache warm, 1 MiB reads, each pass on a fresh open) and the
rate of lstat over many small files (dentries and inodes dropped before each
pass), for: the native directory, gdsfs with kernel passthrough, gdsfs
without it, and go-fuse's example loopback. All are mounted together and
their timed passes interleave; each figure is the best of --runs passes.
Prints the table and whether gdsfs meets its targets; a missed target is
reported, not an error (the exit status is non-zero only when it could not
measure).

Must run as root: it mounts by syscall and writes /proc/sys/vm/drop_caches.`,
		Args: exactArgs(),
		RunE: func(cmd *cobra.Command, args []string) error {
			var err error
			if o.size, err = units.ParseSize(size); err != nil {
				return usageError{fmt.Errorf("--size: %w", err)}
			}
			if err := o.validate(); err != nil {
				return usageError{err}
			}
			if os.Geteuid() != 0 {
				return errors.New("bench mount must run as root: it mounts by syscall and drops the dentry cache through /proc/sys/vm/drop_caches")
			}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			rep, err := runMountBench(ctx, o)
			if err != nil && ctx.Err() != nil {
				return fmt.Errorf("interrupted: %w", err)
			}
			if err != nil {
				return err
			}
			if o.json {
				return rep.writeJSON(os.Stdout)
			}
			return rep.writeText(os.Stdout)
		},
	}
	f := c.Flags()
	f.StringVar(&size, "size", "1GiB", "size of the file read sequentially")
	f.IntVar(&o.files, "files", 10000, "number of 1 KiB files to lstat")
	f.IntVar(&o.runs, "runs", 5, "timed passes per measurement; the best is reported")
	f.StringVar(&o.dir, "dir", "", "work directory, kept afterwards (default: a new directory under /var/tmp, removed at the end)")
	f.StringVar(&o.loopback, "loopback", "", "go-fuse example/loopback `BINARY` (default: loopback beside this binary, if there)")
	f.BoolVar(&o.json, "json", false, "print the results as JSON")
	return c
}

// validate checks the flags and fills in the default loopback binary.
func (o *mountBenchOptions) validate() error {
	switch {
	case o.size < mbReadBlock:
		return fmt.Errorf("--size %s: want at least 1MiB", o.size)
	case o.files < 1:
		return fmt.Errorf("--files %d: want at least 1", o.files)
	case o.runs < 1:
		return fmt.Errorf("--runs %d: want at least 1", o.runs)
	}
	if o.loopback == "" {
		if self, err := os.Executable(); err == nil {
			if p := filepath.Join(filepath.Dir(self), "loopback"); mbIsExecutable(p) {
				o.loopback = p
			}
		}
		return nil
	}
	p, err := filepath.Abs(o.loopback)
	if err != nil || !mbIsExecutable(p) {
		return fmt.Errorf("--loopback %s: not an executable file", o.loopback)
	}
	o.loopback = p
	return nil
}

func mbIsExecutable(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular() && st.Mode().Perm()&0o111 != 0
}

// mbFS is one filesystem under test. All are mounted at once and the
// timed passes interleave, so drift in the machine's speed (noisy
// neighbours) spreads over every row alike.
type mbFS struct {
	key         string   // JSON key and mount directory suffix
	name        string   // table row
	argv        []string // the daemon's command line; nil for native
	gdsfs       bool     // answers MOUNT/.gdsfs/*
	passthrough bool     // gdsfs: asked for fuse.passthrough=on
	unavailable string   // why it cannot be measured at all
}

// filesystems lists the rows in table order.
func (b *mountBench) filesystems() []mbFS {
	gdsfsFS := func(key, name, pt string) mbFS {
		return mbFS{
			key: key, name: name, gdsfs: true, passthrough: pt == "on",
			argv: []string{b.self, "mount", "--set", "fuse.passthrough=" + pt,
				"--set", "ipc.socket=" + filepath.Join(b.dir, key+".sock"), b.source, b.mountpoint(key)},
		}
	}
	lb := mbFS{key: "loopback", name: "go-fuse loopback",
		argv: []string{b.opts.loopback, "-q", "-directmount", b.mountpoint("loopback"), b.source}}
	if b.opts.loopback == "" {
		lb.unavailable = "no --loopback binary (go build -o bin/loopback github.com/hanwen/go-fuse/v2/example/loopback)"
	}
	return []mbFS{
		{key: "native", name: "native"},
		gdsfsFS("gdsfs-passthrough", "gdsfs passthrough", "on"),
		gdsfsFS("gdsfs-no-passthrough", "gdsfs no-passthrough", "off"),
		lb,
	}
}

// mbSubject is a filesystem being measured: where the files appear
// through it, its daemon (nil for native) and its results.
type mbSubject struct {
	fs   mbFS
	root string // SOURCE or the mountpoint
	d    *mbDaemon
	row  *mbRow
}

// runMountBench prepares the files, mounts every filesystem, measures and
// returns the report. Every mount is gone when it returns.
func runMountBench(ctx context.Context, o mountBenchOptions) (rep *mountBenchReport, err error) {
	b, err := newMountBench(o)
	if err != nil {
		return nil, err
	}
	defer b.cleanup()
	b.say("preparing %s: one %s file, %d files of 1KiB", b.dir, o.size, o.files)
	if err := b.prepare(ctx); err != nil {
		return nil, err
	}
	rep = b.newReport()
	defer func() { err = errors.Join(err, b.unmountAll()) }()
	for _, fsys := range b.filesystems() {
		s, err := b.mount(ctx, fsys)
		if err != nil {
			return nil, err
		}
		b.subjects = append(b.subjects, s)
		rep.Rows = append(rep.Rows, s.row)
	}
	for _, step := range []func(context.Context) error{b.warmUpAll, b.measureReads, b.measureStats} {
		if err := step(ctx); err != nil {
			return nil, err
		}
	}
	rep.evaluate()
	return rep, nil
}

// mount starts fsys's daemon. A filesystem the kernel cannot provide comes
// back with its row unavailable, not as an error.
func (b *mountBench) mount(ctx context.Context, fsys mbFS) (*mbSubject, error) {
	s := &mbSubject{fs: fsys, root: b.source, row: &mbRow{Key: fsys.key, Name: fsys.name, Unavailable: fsys.unavailable}}
	if fsys.argv == nil || fsys.unavailable != "" {
		return s, nil
	}
	b.say("mounting %s", fsys.name)
	s.root = b.mountpoint(fsys.key)
	if err := os.MkdirAll(s.root, 0o755); err != nil {
		return nil, fmt.Errorf("%s: mountpoint: %w", fsys.name, err)
	}
	d, err := mbStartDaemon(ctx, fsys.name, s.root, filepath.Join(b.dir, fsys.key+".log"), fsys.argv, fsys.ready(s.root))
	var un *mbUnavailable
	switch {
	case errors.As(err, &un):
		s.row.Unavailable = un.reason
	case err != nil:
		return nil, err
	}
	s.d = d
	return s, nil
}

// unmountAll stops every daemon, last mounted first.
func (b *mountBench) unmountAll() error {
	var errs []error
	for i := len(b.subjects) - 1; i >= 0; i-- {
		if d := b.subjects[i].d; d != nil {
			if err := d.stop(); err != nil {
				b.leftover = true
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// active lists the subjects still being measured.
func (b *mountBench) active() []*mbSubject {
	var out []*mbSubject
	for _, s := range b.subjects {
		if s.row.Unavailable == "" {
			out = append(out, s)
		}
	}
	return out
}
