package fs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/staging/watch"
)

// Every method that changes SOURCE runs as the caller on descriptors
// resolved beneath SOURCE, and answers EROFS when fuse.read_only is true.
// Read-only mode is enforced here rather than with the "ro" mount option,
// which would also forbid writing the .gdsfs control files.

func (n *node) ro() bool { return n.srv.opts.ReadOnly }

// mayChange refuses changes to the control directory's name (even on a
// read-write mount) and every change on a read-only mount.
func (n *node) mayChange(name string) syscall.Errno {
	if name == controlDirName && n.IsRoot() {
		return syscall.EPERM
	}
	if n.ro() {
		return syscall.EROFS
	}
	return 0
}

// asNode is the node of a go-fuse inode of this mount, or nil.
func asNode(e gofs.InodeEmbedder) *node {
	switch v := e.(type) {
	case *node:
		return v
	case *rootNode:
		return &v.node
	}
	return nil
}

var _ = (gofs.NodeSetattrer)((*node)(nil))

// errKillPriv: a caller who is not the owner asked only to clear the
// set-user-ID and set-group-ID bits, as the kernel does before a write or
// truncation by anyone who may write the file.
var errKillPriv = fmt.Errorf("clear set-id bits as a writer: %w", syscall.EPERM)

func (n *node) Setattr(ctx context.Context, f gofs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if n.ro() {
		return syscall.EROFS
	}
	fh, _ := f.(*file)
	if fh == nil {
		fh = n.anyOpen()
	}
	rel, _ := n.rel()
	defer n.srv.changed(rel)
	kill := false
	do := func(in *fuse.SetAttrIn) syscall.Errno {
		return n.srv.as(ctx, func() error {
			return n.onSelf(fh, func(fd int, st *syscall.Stat_t) error {
				if err := setattr(fd, st, fh, in, n); err != nil {
					kill = errors.Is(err, errKillPriv)
					return err
				}
				st, _, err := fstatx(fd)
				if err == nil {
					out.Attr.FromStat(st)
				}
				return err
			})
		})
	}
	errno := do(in)
	if !kill || !n.killPriv(ctx, in) {
		return errno
	}
	rest := *in
	rest.Valid &^= fuse.FATTR_MODE
	return do(&rest)
}

// onSelf runs fn with the node resolved, or, for a node no longer in any
// directory, with an open descriptor of it.
func (n *node) onSelf(fh *file, fn func(fd int, st *syscall.Stat_t) error) error {
	if _, ok := n.rel(); !ok && fh != nil {
		st, _, err := fstatx(fh.fd())
		if err != nil {
			return err
		}
		return fn(fh.fd(), st)
	}
	return n.selfAs(fn)
}

// setattr applies in to the file at fd (O_PATH or open) in the kernel's
// order: mode, owner, size, times.
func setattr(fd int, st *syscall.Stat_t, fh *file, in *fuse.SetAttrIn, n *node) error {
	if mode, ok := in.GetMode(); ok {
		err := unix.Fchmodat(fd, "", mode, unix.AT_EMPTY_PATH)
		if errors.Is(err, syscall.EPERM) && onlyClearsSetID(st.Mode, mode) {
			return errKillPriv
		}
		if err != nil {
			return err
		}
	}
	uid, uok := in.GetUID()
	gid, gok := in.GetGID()
	if uok || gok {
		u, g := -1, -1
		if uok {
			u = int(uid)
		}
		if gok {
			g = int(gid)
		}
		if err := unix.Fchownat(fd, "", u, g, unix.AT_EMPTY_PATH); err != nil {
			return err
		}
	}
	if size, ok := in.GetSize(); ok {
		if err := n.truncate(fh, int64(size)); err != nil {
			return err
		}
	}
	if ts, ok := times(in); ok {
		return unix.UtimesNanoAt(fd, "", ts[:], unix.AT_EMPTY_PATH)
	}
	return nil
}

// truncate truncates through a writable handle of the caller's, or
// through a descriptor the caller opens for writing now (the permission
// truncate(2) needs).
func (n *node) truncate(fh *file, size int64) error {
	if fh != nil && fh.writable {
		return unix.Ftruncate(fh.fd(), size)
	}
	f, _, err := n.resolve(unix.O_WRONLY | unix.O_NONBLOCK)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.Ftruncate(int(f.Fd()), size)
}

// onlyClearsSetID reports whether mode is old with some of its set-id bits
// cleared and nothing else changed.
func onlyClearsSetID(old, mode uint32) bool {
	const setID = syscall.S_ISUID | syscall.S_ISGID
	old &= 0o7777
	return mode != old && mode|setID == old|setID && mode&^old == 0
}

// killPriv clears the set-id bits for a caller who may write the file
// (they proved it by opening it for writing as themselves), as a write by
// them would. It reports whether it did.
func (n *node) killPriv(ctx context.Context, in *fuse.SetAttrIn) bool {
	mode, _ := in.GetMode()
	var w *os.File
	errno := n.srv.as(ctx, func() (err error) {
		w, _, err = n.resolve(unix.O_WRONLY | unix.O_NONBLOCK)
		return err
	})
	if errno != 0 {
		return false
	}
	defer w.Close()
	var st unix.Stat_t
	if unix.Fstat(int(w.Fd()), &st) != nil || !onlyClearsSetID(st.Mode, mode) {
		return false
	}
	return unix.Fchmod(int(w.Fd()), mode) == nil // as the daemon
}

// times turns the request's times into utimensat's, keeping "now" as
// UTIME_NOW (which needs only write access, not ownership).
func times(in *fuse.SetAttrIn) ([2]unix.Timespec, bool) {
	ts := [2]unix.Timespec{{Nsec: unix.UTIME_OMIT}, {Nsec: unix.UTIME_OMIT}}
	set := func(i int, valid, now uint32, sec uint64, nsec uint32) {
		switch {
		case in.Valid&valid == 0:
		case in.Valid&now != 0:
			ts[i] = unix.Timespec{Nsec: unix.UTIME_NOW}
		default:
			ts[i] = unix.Timespec{Sec: int64(sec), Nsec: int64(nsec)}
		}
	}
	set(0, fuse.FATTR_ATIME, fuse.FATTR_ATIME_NOW, in.Atime, in.Atimensec)
	set(1, fuse.FATTR_MTIME, fuse.FATTR_MTIME_NOW, in.Mtime, in.Mtimensec)
	return ts, in.Valid&(fuse.FATTR_ATIME|fuse.FATTR_MTIME) != 0
}

// make creates name in n as the caller with mk and returns its node.
func (n *node) make(ctx context.Context, name string, out *fuse.EntryOut, mk func(dirfd int) error) (*gofs.Inode, syscall.Errno) {
	if errno := n.mayChange(name); errno != 0 {
		return nil, errno
	}
	var st *syscall.Stat_t
	var id fileID
	var fid watch.FID
	errno := n.dir(ctx, func(dirfd int) (err error) {
		if err = mk(dirfd); err != nil {
			return err
		}
		st, id, fid, err = n.statEntry(dirfd, name)
		return err
	})
	if errno != 0 {
		return nil, errno
	}
	n.srv.changed(n.relName(name))
	return n.newChild(ctx, st, id, fid, out), 0
}

var (
	_ = (gofs.NodeMknoder)((*node)(nil))
	_ = (gofs.NodeMkdirer)((*node)(nil))
	_ = (gofs.NodeSymlinker)((*node)(nil))
	_ = (gofs.NodeLinker)((*node)(nil))
)

func (n *node) Mknod(ctx context.Context, name string, mode, rdev uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	return n.make(ctx, name, out, func(dirfd int) error {
		return unix.Mknodat(dirfd, name, mode&syscall.S_IFMT|n.srv.createMode(ctx, dirfd, mode&0o7777), int(rdev))
	})
}

func (n *node) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	return n.make(ctx, name, out, func(dirfd int) error {
		return unix.Mkdirat(dirfd, name, n.srv.createMode(ctx, dirfd, mode&0o7777))
	})
}

func (n *node) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	return n.make(ctx, name, out, func(dirfd int) error { return unix.Symlinkat(target, dirfd, name) })
}

// Link links the target's inode as name: it must still be the entry the
// kernel knows it by.
func (n *node) Link(ctx context.Context, target gofs.InodeEmbedder, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	t := asNode(target)
	if t == nil {
		return nil, syscall.EXDEV
	}
	tname, tparent := t.Parent()
	if tparent == nil {
		return nil, syscall.ENOENT // unlinked: there is no name to link from
	}
	tp := asNode(tparent.Operations())
	ch, errno := n.make(ctx, name, out, func(dirfd int) error {
		return tp.dirAs(func(tdir int) error {
			if _, id, err := statx(tdir, tname, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				return err
			} else if id != t.id {
				return syscall.ESTALE
			}
			return unix.Linkat(tdir, tname, dirfd, name, 0)
		})
	})
	if errno == 0 {
		n.srv.changed(tp.relName(tname))
	}
	return ch, errno
}

var (
	_ = (gofs.NodeRmdirer)((*node)(nil))
	_ = (gofs.NodeUnlinker)((*node)(nil))
	_ = (gofs.NodeRenamer)((*node)(nil))
)

func (n *node) Rmdir(ctx context.Context, name string) syscall.Errno {
	return n.remove(ctx, name, unix.AT_REMOVEDIR)
}

func (n *node) Unlink(ctx context.Context, name string) syscall.Errno {
	return n.remove(ctx, name, 0)
}

func (n *node) remove(ctx context.Context, name string, flags int) syscall.Errno {
	if errno := n.mayChange(name); errno != 0 {
		return errno
	}
	errno := n.dir(ctx, func(dirfd int) error {
		return n.replacing(dirfd, name, func() error { return unix.Unlinkat(dirfd, name, flags) })
	})
	n.srv.changed(n.relName(name))
	return errno
}

func (n *node) Rename(ctx context.Context, name string, newParent gofs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	np := asNode(newParent)
	if np == nil {
		return syscall.EXDEV
	}
	if errno := n.mayChange(name); errno != 0 {
		return errno
	}
	if errno := np.mayChange(newName); errno != 0 {
		return errno
	}
	errno := n.srv.as(ctx, func() error {
		return n.dirAs(func(from int) error {
			return np.dirAs(func(to int) error {
				rename := func() error { return unix.Renameat2(from, name, to, newName, uint(flags)) }
				if flags&(unix.RENAME_NOREPLACE|unix.RENAME_EXCHANGE) != 0 {
					return rename() // no file loses its name
				}
				return np.replacing(to, newName, rename)
			})
		})
	})
	n.srv.changed(n.relName(name))
	n.srv.changed(np.relName(newName))
	return errno
}
