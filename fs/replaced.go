package fs

import (
	"errors"
	"fmt"
	"os"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"golang.org/x/sys/unix"
)

// A regular file unlinked or renamed over through the mount may still be
// opened by a process that reached it before the change: on SOURCE's own
// filesystem such an open gets the old file. The kernel sends that open
// for the node it looked up, whose name is gone or names another file, so
// the node keeps an O_PATH descriptor of its file, taken just before the
// change, until the kernel forgets the node; resolve opens it anew as the
// caller when the node's path no longer leads to its file. Kept files are
// bounded (fdbudget.go): past the bound the file is not kept.

// replacing runs change (an unlink or a rename over name in directory
// dirfd of n) and, when name is a regular file the kernel knows as a node,
// lets that node keep its file from before change runs.
func (n *node) replacing(dirfd int, name string, change func() error) error {
	var ch *node
	if in := n.GetChild(name); in != nil && isRegular(in.StableAttr().Mode) {
		ch, _ = in.Operations().(*node)
	}
	if ch == nil || !n.srv.fds.keep() {
		return change()
	}
	fd, err := unix.Openat(dirfd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		n.srv.fds.unkeep()
		return change()
	}
	f := os.NewFile(uintptr(fd), name)
	if _, id, err := fstatx(fd); err != nil || id != ch.id {
		f.Close() // not the node's file: nothing to keep
		n.srv.fds.unkeep()
		return change()
	}
	// Kept before the change: an open of the node that finds its name
	// changed while change runs (or returns) finds its file kept. If change
	// fails, the node keeps its own file until forgotten: harmless.
	ch.keep(f)
	return change()
}

// keep makes f the node's kept file (nil: none) and lets the one it kept
// before go.
func (n *node) keep(f *os.File) {
	n.mu.Lock()
	old := n.kept
	n.kept = f
	n.mu.Unlock()
	if old != nil {
		old.Close()
		n.srv.fds.unkeep()
	}
}

// reopenKept opens the node's kept file anew with flags, as the calling
// thread's credentials are (the kernel checks them on the file), or
// returns err when the node keeps none.
func (n *node) reopenKept(flags int, err error) (*os.File, *syscall.Stat_t, error) {
	n.mu.Lock()
	var fd int
	var derr error = os.ErrNotExist
	if n.kept != nil {
		fd, derr = unix.FcntlInt(n.kept.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	}
	n.mu.Unlock()
	if derr != nil {
		return nil, nil, err
	}
	defer unix.Close(fd)
	// Through /proc, the inode itself is opened (a magic link is followed
	// even where the caller asked for O_NOFOLLOW: the node is no link).
	nfd, oerr := unix.Open(fmt.Sprintf("/proc/self/fd/%d", fd), (flags|unix.O_CLOEXEC)&^unix.O_NOFOLLOW, 0)
	if oerr != nil {
		return nil, nil, oerr
	}
	st, id, serr := fstatx(nfd)
	if serr == nil && id != n.id {
		serr = errors.New("a kept file changed identity") // cannot happen: an open descriptor pins its inode
	}
	if serr != nil {
		unix.Close(nfd)
		return nil, nil, serr
	}
	return os.NewFile(uintptr(nfd), "kept"), st, nil
}

var _ = (gofs.NodeOnForgetter)((*node)(nil))

// OnForget lets the kept file go: the kernel will not name the node again.
func (n *node) OnForget() {
	n.srv.meta.forget(&n.Inode)
	n.keep(nil)
}
