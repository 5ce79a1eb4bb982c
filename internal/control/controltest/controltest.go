// Package controltest mounts a FUSE file system holding one control file
// that refuses its first write with EAGAIN, as .gdsfs/prefetch does when
// its queue is full. For tests only.
package controltest

import (
	"context"
	"sync"
	"syscall"
	"testing"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
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
