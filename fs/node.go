package fs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"sync"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/internal/access"
	"github.com/gdsfs/gdsfs/staging/watch"
)

// node is a file, directory or other entry of SOURCE. It never acts by
// path as root: every call resolves the node's path beneath SOURCE with
// the caller's credentials (access.Root, no symbolic link on the way: the
// kernel already walked it), checks that the path still names the node's
// inode (ESTALE otherwise, so the kernel looks the name up again), and acts
// on the descriptor it resolved.
type node struct {
	gofs.Inode
	srv *Server
	id  fileID    // the backing inode this node stands for; fixed
	fid watch.FID // what change events name the file by, when the kernel may cache it for long (meta.go); fixed

	mu       sync.Mutex
	seen     fileVersion        // the file's version at the last open; guarded by mu
	open     map[*file]struct{} // handles open on the node; guarded by mu
	kept     *os.File           // the file, O_PATH, once unlinked or renamed over through the mount (replaced.go); guarded by mu
	noXattr  map[string]bool    // security.* names the file has none of (xattr.go); guarded by mu
	xattrGen uint64             // counts forgetXattrs; guarded by mu
	// backing is the passthrough backing id a predecessor daemon
	// registered for the node's open files (handover.go): the kernel
	// takes no other for the inode while one is open. Fixed at Adopt.
	backing int32
}

// anyOpen returns one handle open on the node, or nil.
func (n *node) anyOpen() *file {
	n.mu.Lock()
	defer n.mu.Unlock()
	for f := range n.open {
		return f
	}
	return nil
}

// fileID names a backing inode: device, inode number and birth time (so a
// reused inode number is another file).
type fileID struct {
	dev, ino, gen uint64
}

// fileVersion tells whether a file changed between two looks at it.
type fileVersion struct {
	size         int64
	mtime, ctime syscall.Timespec
}

func versionOf(st *syscall.Stat_t) fileVersion {
	return fileVersion{size: st.Size, mtime: st.Mtim, ctime: st.Ctim}
}

// rel is the node's path relative to SOURCE ("." for the root). ok is
// false for a node no longer in any directory (unlinked while open).
func (n *node) rel() (string, bool) {
	if n.IsRoot() {
		return ".", true
	}
	if _, parent := n.Parent(); parent == nil {
		return "", false
	}
	// Below a removed directory, go-fuse names a path that does not
	// exist; the identity check catches any other stale path.
	p := n.Path(n.Root())
	return p, p != ""
}

// relName is the path of name in directory n.
func (n *node) relName(name string) string {
	r, _ := n.rel()
	return path.Join(r, name)
}

// resolve opens the node's path as the calling thread's credentials are
// (call it inside Cred.Do) with flags, and checks that it still names the
// node's inode. A file unlinked or renamed over through the mount is
// opened from the descriptor its node kept (replaced.go).
func (n *node) resolve(flags int) (*os.File, *syscall.Stat_t, error) {
	rel, ok := n.rel()
	if !ok {
		return n.reopenKept(flags, syscall.ENOENT)
	}
	f, err := n.srv.root.Open(rel, flags|unix.O_NOFOLLOW, 0, access.NoSymlinks)
	if errors.Is(err, syscall.ENOENT) {
		return n.reopenKept(flags, err)
	}
	if err != nil {
		return nil, nil, err
	}
	st, id, err := fstatx(int(f.Fd()))
	if err == nil && !n.IsRoot() && id != n.id {
		f.Close()
		return n.reopenKept(flags, fmt.Errorf("%s names another file than the kernel looked up: %w", rel, syscall.ESTALE))
	}
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	return f, st, nil
}

// self runs fn as the caller with an O_PATH descriptor of the node itself
// (a symbolic link is not followed).
func (n *node) self(ctx context.Context, fn func(fd int, st *syscall.Stat_t) error) syscall.Errno {
	return n.srv.as(ctx, func() error { return n.selfAs(fn) })
}

// selfAs is self for a caller already in effect.
func (n *node) selfAs(fn func(fd int, st *syscall.Stat_t) error) error {
	f, st, err := n.resolve(unix.O_PATH)
	if err != nil {
		return err
	}
	defer f.Close()
	return fn(int(f.Fd()), st)
}

// dirAs runs fn with an O_PATH descriptor of directory n, for a caller
// already in effect.
func (n *node) dirAs(fn func(dirfd int) error) error {
	f, _, err := n.resolve(unix.O_PATH | unix.O_DIRECTORY)
	if err != nil {
		return err
	}
	defer f.Close()
	return fn(int(f.Fd()))
}

// dir runs fn as the caller with an O_PATH descriptor of directory n.
func (n *node) dir(ctx context.Context, fn func(dirfd int) error) syscall.Errno {
	return n.srv.as(ctx, func() error { return n.dirAs(fn) })
}

// newChild makes the node for the entry st (a child of n) and fills out;
// fid is what change events name the file by ("" when the kernel may not
// cache it for long).
func (n *node) newChild(ctx context.Context, st *syscall.Stat_t, id fileID, fid watch.FID, out *fuse.EntryOut) *gofs.Inode {
	ch := n.NewInode(ctx, &node{srv: n.srv, id: id, fid: fid}, n.srv.stableAttr(st, id))
	out.Attr.FromStat(st)
	n.srv.meta.cacheEntry(fid, ch, out)
	return ch
}

// statEntry is statx of name in dirfd (not following a symbolic link),
// with what change events name the file by when the kernel may cache it
// for long.
func (n *node) statEntry(dirfd int, name string) (*syscall.Stat_t, fileID, watch.FID, error) {
	if !n.srv.meta.on {
		st, id, err := statx(dirfd, name, unix.AT_SYMLINK_NOFOLLOW)
		return st, id, "", err
	}
	fd, err := unix.Openat(dirfd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fileID{}, "", err
	}
	defer unix.Close(fd)
	st, id, err := fstatx(fd)
	if err != nil {
		return nil, fileID{}, "", err
	}
	return st, id, n.srv.meta.fid(fd, id), nil
}

// stableAttr is go-fuse's identity of a backing inode: its node id (the
// kernel's name for it, and its st_ino through the mount: nodeids.go), and
// its birth time as generation.
func (s *Server) stableAttr(st *syscall.Stat_t, id fileID) gofs.StableAttr {
	return gofs.StableAttr{Mode: st.Mode, Ino: s.ids.of(id.dev, id.ino), Gen: id.gen}
}

var _ = (gofs.NodeLookuper)((*node)(nil))

func (n *node) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	var st *syscall.Stat_t
	var id fileID
	var fid watch.FID
	errno := n.dir(ctx, func(dirfd int) (err error) {
		st, id, fid, err = n.statEntry(dirfd, name)
		return err
	})
	if errno != 0 {
		return nil, errno
	}
	ch := n.newChild(ctx, st, id, fid, out)
	n.srv.lookedUp(ctx, ch)
	return ch, 0
}

// lookedUp counts the reference a READDIRPLUS entry gives the kernel
// (kernelrefs.go); umaskFS counts those of other replies.
func (s *Server) lookedUp(ctx context.Context, ch *gofs.Inode) {
	if fc, ok := ctx.(*fuse.Context); ok && s.raw.refs.inPlus(fc.Cancel) {
		s.raw.refs.ref(ch.StableAttr().Ino, 1)
	}
}

// stash records the handle a request opened, for umaskFS to file under
// the kernel's handle number.
func (s *Server) stash(ctx context.Context, h gofs.FileHandle) {
	if fc, ok := ctx.(*fuse.Context); ok {
		s.raw.refs.stash(fc.Cancel, h)
	}
}

var _ = (gofs.NodeGetattrer)((*node)(nil))

// Getattr answers from an open descriptor of the node when there is one
// (a file unlinked while open has no path), else from the path.
func (n *node) Getattr(ctx context.Context, f gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	if fh, ok := f.(*file); ok {
		st, _, err := fstatx(fh.fd())
		if err != nil {
			return n.srv.errs.toErrno(err)
		}
		out.Attr.FromStat(st)
		n.attrTimeout(out)
		return 0
	}
	return n.self(ctx, func(fd int, st *syscall.Stat_t) error {
		out.Attr.FromStat(st)
		n.attrTimeout(out)
		return nil
	})
}

var _ = (gofs.NodeReadlinker)((*node)(nil))

func (n *node) Readlink(ctx context.Context) ([]byte, syscall.Errno) {
	var target []byte
	errno := n.self(ctx, func(fd int, st *syscall.Stat_t) error {
		for size := 256; ; size *= 2 {
			buf := make([]byte, size)
			k, err := unix.Readlinkat(fd, "", buf)
			if err != nil {
				return err
			}
			if k < size {
				target = buf[:k]
				return nil
			}
		}
	})
	return target, errno
}

var _ = (gofs.NodeOpendirHandler)((*node)(nil))

// OpendirHandle opens the directory as the caller; entries are read from
// that descriptor, charged to the caller's uid until released.
func (n *node) OpendirHandle(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	if h := n.srv.adopting.Swap(nil); h != nil {
		return *h, 0, 0
	}
	ch, errno := n.srv.fds.take(ctx)
	if errno != 0 {
		return nil, 0, errno
	}
	var fd int
	errno = n.srv.as(ctx, func() error {
		f, _, err := n.resolve(unix.O_RDONLY | unix.O_DIRECTORY)
		if err != nil {
			return err
		}
		defer f.Close()
		fd, err = unix.Dup(int(f.Fd()))
		return err
	})
	if errno != 0 {
		ch.release()
		return nil, 0, errno
	}
	unix.CloseOnExec(fd)
	ds, errno := gofs.NewLoopbackDirStreamFd(fd)
	if errno != 0 {
		unix.Close(fd)
		ch.release()
		return nil, 0, errno
	}
	stream, ok := ds.(dirStream)
	if !ok { // go-fuse's loopback stream is one: cannot happen
		ds.Close()
		ch.release()
		return nil, 0, syscall.EIO
	}
	var cache uint32
	if n.cachedMeta() {
		cache = fuse.FOPEN_CACHE_DIR | fuse.FOPEN_KEEP_CACHE
	}
	h := &dirHandle{dirStream: stream, charge: ch, fd: fd}
	n.srv.stash(ctx, h)
	return h, cache, 0
}

// dirStream is what go-fuse's loopback directory stream does.
type dirStream interface {
	gofs.FileReaddirenter
	gofs.FileSeekdirer
	gofs.FileFsyncdirer
	gofs.FileReleasedirer
	gofs.FileIoctler
}

// dirHandle is an open directory; releasing it gives its charge back.
type dirHandle struct {
	dirStream
	charge *charge
	fd     int // the stream's descriptor, until released
}

var _ = (gofs.FileReleasedirer)((*dirHandle)(nil))

func (d *dirHandle) Releasedir(ctx context.Context, flags uint32) {
	d.dirStream.Releasedir(ctx, flags)
	d.charge.release()
}

var _ = (gofs.NodeStatfser)((*node)(nil))

func (n *node) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	return n.self(ctx, func(fd int, _ *syscall.Stat_t) error {
		var st syscall.Statfs_t
		if err := syscall.Fstatfs(fd, &st); err != nil {
			return err
		}
		out.FromStatfsT(&st)
		return nil
	})
}

var _ = (gofs.NodeAccesser)((*node)(nil))

// Access answers access(2) as the caller (AT_EACCESS: with the
// credentials in effect, which are the caller's).
func (n *node) Access(ctx context.Context, mask uint32) syscall.Errno {
	return n.self(ctx, func(fd int, _ *syscall.Stat_t) error {
		return unix.Faccessat2(fd, "", mask, unix.AT_EACCESS|unix.AT_EMPTY_PATH)
	})
}

// statx stats name in dirfd (flags: AT_SYMLINK_NOFOLLOW or AT_EMPTY_PATH)
// and returns the attributes with the file's identity.
func statx(dirfd int, name string, flags int) (*syscall.Stat_t, fileID, error) {
	var x unix.Statx_t
	if err := unix.Statx(dirfd, name, flags, unix.STATX_BASIC_STATS|unix.STATX_BTIME, &x); err != nil {
		return nil, fileID{}, err
	}
	st := &syscall.Stat_t{
		Dev: unix.Mkdev(x.Dev_major, x.Dev_minor), Ino: x.Ino, Nlink: uint64(x.Nlink),
		Mode: uint32(x.Mode), Uid: x.Uid, Gid: x.Gid, Rdev: unix.Mkdev(x.Rdev_major, x.Rdev_minor),
		Size: int64(x.Size), Blksize: int64(x.Blksize), Blocks: int64(x.Blocks),
		Atim: timespec(x.Atime), Mtim: timespec(x.Mtime), Ctim: timespec(x.Ctime),
	}
	id := fileID{dev: st.Dev, ino: st.Ino, gen: 1}
	if x.Mask&unix.STATX_BTIME != 0 {
		id.gen = uint64(x.Btime.Sec)*1e9 + uint64(x.Btime.Nsec)
	}
	return st, id, nil
}

// fstatx is statx of an open descriptor (O_PATH ones included).
func fstatx(fd int) (*syscall.Stat_t, fileID, error) {
	return statx(fd, "", unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW)
}

func timespec(t unix.StatxTimestamp) syscall.Timespec {
	return syscall.Timespec{Sec: t.Sec, Nsec: int64(t.Nsec)}
}

// rootNode is the mount's root: a node that also answers the .gdsfs lookup.
type rootNode struct {
	node
	ctl        *gofs.Inode // the control directory, made in OnAdd
	adoptNodes adoptNodes  // while Adopt registers a predecessor's nodes (adopt.go)
}

var _ = (gofs.NodeOnAdder)((*rootNode)(nil))

func (r *rootNode) OnAdd(ctx context.Context) {
	r.ctl = r.NewPersistentInode(ctx, &controlDir{srv: r.srv},
		gofs.StableAttr{Mode: syscall.S_IFDIR, Ino: controlIno})
}

var _ = (gofs.NodeLookuper)((*rootNode)(nil))

// Lookup serves .gdsfs from the daemon, everything else from SOURCE.
func (r *rootNode) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	if name == controlDirName {
		r.ctl.Operations().(*controlDir).fillAttr(&out.Attr)
		r.srv.lookedUp(ctx, r.ctl)
		return r.ctl, 0
	}
	ch, errno := r.node.Lookup(ctx, name, out)
	if errno == syscall.ENOENT {
		r.srv.noticeRemoved()
	}
	return ch, errno
}

// isRegular reports whether mode is a regular file's.
func isRegular(mode uint32) bool { return mode&syscall.S_IFMT == syscall.S_IFREG }
