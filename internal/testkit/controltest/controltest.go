// Package controltest mounts a FUSE file system holding one control file
// that refuses its first write with EAGAIN, as .gdsfs/prefetch does when
// its queue is full. For tests only.
package controltest

import (
	"context"
	"os"
	"sync"
	"syscall"
	"testing"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// RefusingFile refuses its first write with EAGAIN and keeps the lines it
// takes after that.
type RefusingFile struct {
	gofs.Inode
	mu      sync.Mutex
	refused bool
	lines   []string
}

var _ = (gofs.NodeOpener)((*RefusingFile)(nil))

func (f *RefusingFile) Open(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	return nil, fuse.FOPEN_DIRECT_IO, 0
}

var _ = (gofs.NodeWriter)((*RefusingFile)(nil))

func (f *RefusingFile) Write(ctx context.Context, fh gofs.FileHandle, data []byte, off int64) (uint32, syscall.Errno) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.refused {
		f.refused = true
		return 0, syscall.EAGAIN
	}
	f.lines = append(f.lines, string(data))
	return uint32(len(data)), 0
}

var _ = (gofs.NodeGetattrer)((*RefusingFile)(nil))

func (f *RefusingFile) Getattr(ctx context.Context, fh gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	out.Mode = syscall.S_IFREG | 0o644
	return 0
}

// Lines are the writes taken.
func (f *RefusingFile) Lines() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string{}, f.lines...)
}

// Mount mounts, on dir, a file system whose only file is NAME, a
// RefusingFile; it is unmounted in t.Cleanup.
func Mount(t *testing.T, dir, name string) *RefusingFile {
	t.Helper()
	file := &RefusingFile{}
	root := &gofs.Inode{}
	srv, err := gofs.Mount(dir, root, &gofs.Options{
		MountOptions: fuse.MountOptions{FsName: "controltest", DirectMount: true},
		OnAdd: func(ctx context.Context) {
			root.AddChild(name, root.NewPersistentInode(ctx, file, gofs.StableAttr{Mode: syscall.S_IFREG}), false)
		},
	})
	if err != nil {
		t.Fatalf("mount a FUSE file system (the test runs as root with /dev/fuse): %v", err)
	}
	t.Cleanup(func() { srv.Unmount() })
	return file
}

// RequireBlocking fails t when f's descriptor is non-blocking: a write the
// control file refuses with EAGAIN would then wait for a poll event that
// never comes. It reads the flags through SyscallConn, not Fd (which would
// put the descriptor in blocking mode).
func RequireBlocking(t *testing.T, f *os.File) {
	t.Helper()
	sc, err := f.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var flags int
	var ferr error
	if err := sc.Control(func(fd uintptr) { flags, ferr = unix.FcntlInt(fd, unix.F_GETFL, 0) }); err != nil || ferr != nil {
		t.Fatal(err, ferr)
	}
	if flags&unix.O_NONBLOCK != 0 {
		t.Fatalf("%s: the descriptor is non-blocking (flags %#x): a refused write would wait for a poll event that never comes", f.Name(), flags)
	}
}
