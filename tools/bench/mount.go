package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/gdsfs/gdsfs/internal/units"
)

const (
	bigName   = "big.bin"
	manyDir   = "many"
	smallSize = 1 << 10
	readBlock = 1 << 20
)

type MountOptions struct {
	Size  units.Size
	Files int
	Runs  int
	// MetaFiles is the size of the tree find and ls -lR walk (0: not
	// measured).
	MetaFiles int
	Dir       string // work directory, kept; "" makes one under /var/tmp, removed at the end
	Loopback  string // go-fuse example/loopback binary; "" if none was found
}

const MountDoc = `Measures, in one run and on the same files, sequential read throughput of one
big file (page cache warm, 1 MiB reads, each pass on a fresh open) and the
rate of lstat over many small files (dentries and inodes dropped before each
pass), for: the native directory, gdsfs with kernel passthrough, gdsfs
without it, and go-fuse's example loopback. All are mounted together and
their timed passes interleave; each figure is the best of --runs passes.
Then, warm, find and ls -lR over a tree of --meta-files empty files
(1,000 per directory) on native and gdsfs: gdsfs within 3x native.
Prints the table and whether gdsfs meets its targets. Without a loopback
binary (--loopback, or loopback beside this binary) the stat target is not
measured here; a gdsfs mount the kernel cannot give (passthrough refused)
leaves its target not checked.

Must run as root: it mounts by syscall and writes /proc/sys/vm/drop_caches.

` + VerdictRule

func (o *MountOptions) Validate() error {
	switch {
	case o.Size < readBlock:
		return fmt.Errorf("--size %s: want at least 1MiB", o.Size)
	case o.Files < 1:
		return fmt.Errorf("--files %d: want at least 1", o.Files)
	case o.Runs < 1:
		return fmt.Errorf("--runs %d: want at least 1", o.Runs)
	case o.MetaFiles < 0:
		return fmt.Errorf("--meta-files %d: want 0 or more", o.MetaFiles)
	}
	if o.Loopback == "" {
		if self, err := os.Executable(); err == nil {
			if p := filepath.Join(filepath.Dir(self), "loopback"); isExecutable(p) {
				o.Loopback = p
			}
		}
		return nil
	}
	p, err := filepath.Abs(o.Loopback)
	if err != nil || !isExecutable(p) {
		return fmt.Errorf("--loopback %s: not an executable file", o.Loopback)
	}
	o.Loopback = p
	return nil
}

func Mount(ctx context.Context, o MountOptions) (*MountReport, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("bench mount must run as root: it mounts by syscall and drops the dentry cache through /proc/sys/vm/drop_caches")
	}
	rep, err := runMountBench(ctx, o)
	if err != nil && ctx.Err() != nil {
		return nil, fmt.Errorf("interrupted: %w", err)
	}
	return rep, err
}

func isExecutable(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular() && st.Mode().Perm()&0o111 != 0
}

type mountFS struct {
	key         string   // JSON key and mount directory suffix
	name        string   // table row
	argv        []string // the daemon's command line; nil for native
	gdsfs       bool     // answers MOUNT/.gdsfs/*
	socket      string   // gdsfs: its lease socket
	passthrough bool     // gdsfs: asked for fuse.passthrough=on
	unavailable string   // why it cannot be measured at all
}

func (b *mountBench) filesystems() []mountFS {
	gdsfsFS := func(key, name, pt string) mountFS {
		socket := filepath.Join(b.dir, key+".sock")
		return mountFS{
			key: key, name: name, gdsfs: true, passthrough: pt == "on", socket: socket,
			argv: []string{b.self, "mount", "--set", "fuse.passthrough=" + pt,
				"--set", "ipc.socket=" + socket, b.source, b.mountpoint(key)},
		}
	}
	lb := mountFS{key: "loopback", name: "go-fuse loopback",
		argv: []string{b.opts.Loopback, "-q", "-directmount", b.mountpoint("loopback"), b.source}}
	if b.opts.Loopback == "" {
		lb.unavailable = statusNotHere + "no --loopback binary (go build -o bin/loopback github.com/hanwen/go-fuse/v2/example/loopback)"
	}
	return []mountFS{
		{key: "native", name: "native"},
		gdsfsFS("gdsfs-passthrough", "gdsfs passthrough", "on"),
		gdsfsFS("gdsfs-no-passthrough", "gdsfs no-passthrough", "off"),
		lb,
	}
}

type subject struct {
	fs   mountFS
	root string // SOURCE or the mountpoint
	d    *daemon
	row  *mountRow
}

func runMountBench(ctx context.Context, o MountOptions) (rep *MountReport, err error) {
	b, err := newMountBench(o)
	if err != nil {
		return nil, err
	}
	defer b.cleanup()
	b.say("preparing %s: one %s file, %d files of 1KiB", b.dir, o.Size, o.Files)
	if err := b.prepare(ctx); err != nil {
		return nil, err
	}
	if err := b.prepareMeta(ctx); err != nil {
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
	for _, step := range []func(context.Context) error{b.warmUpAll, b.measureReads, b.measureStats, b.measureMeta} {
		if err := step(ctx); err != nil {
			return nil, err
		}
	}
	rep.evaluate(b.metaUnavailable())
	return rep, nil
}

func (b *mountBench) mount(ctx context.Context, fsys mountFS) (*subject, error) {
	s := &subject{fs: fsys, root: b.source, row: &mountRow{Key: fsys.key, Name: fsys.name, Unavailable: fsys.unavailable}}
	if fsys.argv == nil || fsys.unavailable != "" {
		return s, nil
	}
	b.say("mounting %s", fsys.name)
	s.root = b.mountpoint(fsys.key)
	if err := os.MkdirAll(s.root, 0o755); err != nil {
		return nil, fmt.Errorf("%s: mountpoint: %w", fsys.name, err)
	}
	d, err := startDaemon(ctx, fsys.name, s.root, filepath.Join(b.dir, fsys.key+".log"), fsys.argv, fsys.readiness())
	var un *unavailableError
	switch {
	case errors.As(err, &un):
		s.row.Unavailable = un.reason
	case err != nil:
		return nil, err
	}
	s.d = d
	return s, nil
}

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

func (b *mountBench) active() []*subject {
	var out []*subject
	for _, s := range b.subjects {
		if s.row.Unavailable == "" {
			out = append(out, s)
		}
	}
	return out
}
