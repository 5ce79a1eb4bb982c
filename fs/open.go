package fs

import (
	"context"
	"os"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/internal/access"
	"github.com/gdsfs/gdsfs/staging"
)

// openFlags are the kernel's open flags as passed on to SOURCE: O_APPEND
// is dropped (the kernel gives every write its offset), so are the bits
// that are not the backing file's (exec, creation). O_NONBLOCK is always
// added, so that an entry swapped for a FIFO never blocks the daemon; it
// is cleared again on the file unless the caller asked for it.
func openFlags(flags uint32) int {
	return int(flags)&^(syscall.O_APPEND|fuse.FMODE_EXEC|syscall.O_CREAT|syscall.O_EXCL|syscall.O_NOCTTY) |
		unix.O_NONBLOCK
}

var _ = (gofs.NodeOpener)((*node)(nil))

// Open opens the backing file as the caller. A path that now names
// another inode than the node (renamed over in SOURCE within the entry
// timeout) answers ESTALE: the kernel looks the name up again and retries,
// so a kernel passthrough backing file is only ever shared by opens of the
// same inode.
func (n *node) Open(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	if h := n.srv.adopting.Swap(nil); h != nil {
		return *h, 0, 0
	}
	if errno := n.srv.drain.admit(); errno != 0 {
		return nil, 0, errno
	}
	if n.srv.opts.ReadOnly && writes(flags) {
		return nil, 0, syscall.EROFS
	}
	ch, errno := n.srv.fds.take(ctx)
	if errno != 0 {
		return nil, 0, errno
	}
	var f *os.File
	var st *syscall.Stat_t
	errno = n.srv.as(ctx, func() (err error) {
		f, st, err = n.resolve(openFlags(flags))
		return err
	})
	if errno != 0 {
		ch.release()
		return nil, 0, errno
	}
	rel, _ := n.rel()
	var pid uint32
	if c, ok := fuse.FromContext(ctx); ok {
		pid = c.Pid
	}
	h, fl, errno := n.opened(f, st, ch, rel, pid, flags, writes(flags))
	if errno == 0 {
		n.srv.stash(ctx, h)
	}
	return h, fl, errno
}

// opened makes the file handle of a backing file opened for the kernel:
// it invalidates the kernel's attributes and pages of a file that changed
// since the kernel last saw it (before the open returns, so no read is
// cut to an old size), and tells the Stager. The handle gives back the
// open's charge ch when released.
func (n *node) opened(f *os.File, st *syscall.Stat_t, ch *charge, rel string, pid, flags uint32, write bool) (gofs.FileHandle, uint32, syscall.Errno) {
	if flags&syscall.O_NONBLOCK == 0 {
		if err := setNonblock(f, false); err != nil {
			f.Close()
			ch.release()
			return nil, 0, n.srv.errs.toErrno(err)
		}
	}
	h := &file{LoopbackFile: gofs.NewLoopbackFileFromOS(f), srv: n.srv, node: n, rel: rel, charge: ch,
		writable: flags&syscall.O_ACCMODE != syscall.O_RDONLY}
	n.mu.Lock()
	if n.open == nil {
		n.open = map[*file]struct{}{}
	}
	n.open[h] = struct{}{}
	n.mu.Unlock()
	n.srv.drain.opened()
	if !isRegular(st.Mode) {
		return h, 0, 0
	}
	var fl uint32
	if n.sawVersion(st) {
		n.NotifyContent(0, 0) // attributes and every cached page
	} else {
		fl |= fuse.FOPEN_KEEP_CACHE // go-fuse drops it for passthrough opens
	}

	n.srv.opens.Add(1)
	if write {
		// Staging a file being written would copy bytes about to change.
		h.written = true
		n.srv.changed(rel)
	} else if s := n.srv.stager; s != nil {
		h.reading = true
		s.OpenedBy(rel, staging.Reader{PID: pid, Dev: n.srv.mountDev.Load(), Ino: n.StableAttr().Ino, Size: st.Size})
	}
	return h, fl, 0
}

// sawVersion records st as seen at an open and reports whether it differs
// from the version at the last open. Every open that finds a change (and
// the node's first) invalidates the kernel's attributes and pages, so when
// the version is unchanged the kernel holds this version's attributes or
// none. (Attributes in replies are not trusted for this: the kernel may
// drop a reply's attributes that race with a change of its own.)
func (n *node) sawVersion(st *syscall.Stat_t) bool {
	v := versionOf(st)
	n.mu.Lock()
	defer n.mu.Unlock()
	same := n.seen == v
	n.seen = v
	return !same
}

func setNonblock(f *os.File, on bool) error {
	fl, err := unix.FcntlInt(f.Fd(), unix.F_GETFL, 0)
	if err == nil {
		if on {
			fl |= unix.O_NONBLOCK
		} else {
			fl &^= unix.O_NONBLOCK
		}
		_, err = unix.FcntlInt(f.Fd(), unix.F_SETFL, fl)
	}
	return err
}

var _ = (gofs.NodeCreater)((*node)(nil))

// Create creates and opens name as the caller (read-write mode only). An
// entry that appeared meanwhile is opened only if it is a regular file and
// never followed if it is a symbolic link.
func (n *node) Create(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut) (*gofs.Inode, gofs.FileHandle, uint32, syscall.Errno) {
	if errno := n.srv.drain.admit(); errno != 0 {
		return nil, nil, 0, errno
	}
	if errno := n.mayChange(name); errno != 0 {
		return nil, nil, 0, errno
	}
	chg, errno := n.srv.fds.take(ctx)
	if errno != 0 {
		return nil, nil, 0, errno
	}
	var f *os.File
	var st *syscall.Stat_t
	var id fileID
	how := &unix.OpenHow{
		Flags:   uint64(openFlags(flags) | int(flags&syscall.O_EXCL) | unix.O_CREAT | unix.O_NOFOLLOW | unix.O_CLOEXEC),
		Resolve: access.NoSymlinks,
	}
	errno = n.srv.as(ctx, func() error {
		return n.dirAs(func(dirfd int) error {
			how.Mode = uint64(n.srv.createMode(ctx, dirfd, mode&0o7777))
			fd, err := openat2(dirfd, name, how)
			if err != nil {
				return err
			}
			f = os.NewFile(uintptr(fd), name)
			if st, id, err = fstatx(fd); err == nil && !isRegular(st.Mode) {
				err = syscall.ESTALE // a FIFO or device took the name: let the kernel look again
			}
			if err != nil {
				f.Close()
			}
			return err
		})
	})
	if errno != 0 {
		chg.release()
		return nil, nil, 0, errno
	}
	rel := n.relName(name)
	ch := n.newChild(ctx, st, id, n.srv.meta.fid(int(f.Fd()), id), out)
	h, fl, errno := ch.Operations().(*node).opened(f, st, chg, rel, 0, flags, true)
	if errno == 0 {
		n.srv.stash(ctx, h)
	}
	return ch, h, fl, errno
}

// openat2 retries EINTR and EAGAIN (as access.Root does).
func openat2(dirfd int, name string, how *unix.OpenHow) (int, error) {
	for i := 0; ; i++ {
		fd, err := unix.Openat2(dirfd, name, how)
		if (err == unix.EINTR || err == unix.EAGAIN) && i < 16 {
			continue
		}
		return fd, err
	}
}

// writes reports whether open flags ask for write access or truncation.
func writes(flags uint32) bool {
	return flags&syscall.O_ACCMODE != syscall.O_RDONLY || flags&syscall.O_TRUNC != 0
}

// file is an open backing file, opened as the caller. Reads that reach the
// daemon (no passthrough) are counted; the Stager hears of opens for
// reading ending and of writes.
type file struct {
	*gofs.LoopbackFile
	srv      *Server
	node     *node
	rel      string  // at open
	charge   *charge // against the opener's uid (fdbudget.go); nil for the daemon's own
	writable bool    // opened for writing
	reading  bool    // a regular file opened for reading only: Closed on release
	written  bool    // a regular file opened for writing: Changed on write and release
	adopted  bool    // taken over from a predecessor daemon (handover.go)
}

func (f *file) fd() int {
	fd, _ := f.LoopbackFile.PassthroughFd()
	return fd
}

var _ = (gofs.FileReader)((*file)(nil))

func (f *file) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	f.srv.reads.Add(1)
	f.srv.readBytes.Add(uint64(len(dest)))
	return f.LoopbackFile.Read(ctx, dest, off)
}

var _ = (gofs.FileWriter)((*file)(nil))

func (f *file) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	n, errno := f.LoopbackFile.Write(ctx, data, off)
	f.srv.changed(f.rel)
	return n, errno
}

var _ = (gofs.FileAllocater)((*file)(nil))

func (f *file) Allocate(ctx context.Context, off, size uint64, mode uint32) syscall.Errno {
	errno := f.LoopbackFile.Allocate(ctx, off, size, mode)
	f.srv.changed(f.rel)
	return errno
}

var _ = (gofs.FileReleaser)((*file)(nil))

// Release closes the backing file. Writes through passthrough never reach
// the daemon, so a file opened for writing counts as changed once more
// when it closes.
func (f *file) Release(ctx context.Context) syscall.Errno {
	f.node.mu.Lock()
	delete(f.node.open, f)
	f.node.mu.Unlock()
	errno := f.LoopbackFile.Release(ctx)
	f.charge.release()
	f.srv.drain.closed()
	if s := f.srv.stager; s != nil && f.reading {
		s.Closed(f.rel)
	}
	if f.written {
		f.srv.changed(f.rel)
	}
	return errno
}

var _ = (gofs.FilePassthroughFder)((*file)(nil))

// PassthroughFd offers the backing descriptor to the kernel only when
// passthrough was settled on at mount.
func (f *file) PassthroughFd() (int, bool) {
	if !f.srv.passthrough.Load() || f.adopted || f.node.backing != 0 {
		return 0, false
	}
	return f.LoopbackFile.PassthroughFd()
}

var _ = (gofs.NodeCopyFileRanger)((*node)(nil))

// CopyFileRange copies between two backing files in the kernel.
func (n *node) CopyFileRange(ctx context.Context, fhIn gofs.FileHandle, offIn uint64, out *gofs.Inode,
	fhOut gofs.FileHandle, offOut uint64, length uint64, flags uint64) (uint32, syscall.Errno) {
	in, ok1 := fhIn.(*file)
	dst, ok2 := fhOut.(*file)
	if !ok1 || !ok2 {
		return 0, syscall.ENOTSUP
	}
	inOff, outOff := int64(offIn), int64(offOut)
	k, err := unix.CopyFileRange(in.fd(), &inOff, dst.fd(), &outOff, int(length), int(flags))
	n.srv.changed(dst.rel)
	return uint32(max(k, 0)), n.srv.errs.toErrno(err)
}

var _ = (gofs.NodeIoctler)((*node)(nil))

// Ioctl reaches the backing file only when it cannot change anything the
// caller may not: the daemon runs it with its own privileges. Pure getters
// (_IOR, such as FS_IOC_GETFLAGS for lsattr) pass for everyone; anything
// else (chattr, enabling fs-verity) only for root on a read-write mount.
func (n *node) Ioctl(ctx context.Context, f gofs.FileHandle, cmd uint32, arg uint64, input, output []byte) (int32, syscall.Errno) {
	var fio gofs.FileIoctler
	switch h := f.(type) {
	case *file:
		fio = h.LoopbackFile
	case gofs.FileIoctler:
		fio = h // a directory stream
	default:
		return 0, syscall.ENOTTY
	}
	const iocRead = 2 // _IOC_READ: the kernel only hands data back
	caller, known := fuse.FromContext(ctx)
	privileged := known && caller.Uid == 0 && !n.srv.opts.ReadOnly
	if cmd>>30 != iocRead && !privileged {
		return 0, syscall.ENOTTY
	}
	return fio.Ioctl(ctx, cmd, arg, input, output)
}

var _ = (gofs.NodeTmpfiler)((*node)(nil))

// Tmpfile makes an unnamed file in directory n as the caller (O_TMPFILE).
func (n *node) Tmpfile(ctx context.Context, flags, mode uint32, out *fuse.EntryOut) (*gofs.Inode, gofs.FileHandle, uint32, syscall.Errno) {
	if errno := n.srv.drain.admit(); errno != 0 {
		return nil, nil, 0, errno
	}
	if n.ro() {
		return nil, nil, 0, syscall.EROFS
	}
	chg, errno := n.srv.fds.take(ctx)
	if errno != 0 {
		return nil, nil, 0, errno
	}
	var f *os.File
	var st *syscall.Stat_t
	var id fileID
	how := &unix.OpenHow{Flags: uint64(openFlags(flags) | unix.O_TMPFILE | unix.O_CLOEXEC)}
	errno = n.dir(ctx, func(dirfd int) error {
		how.Mode = uint64(n.srv.createMode(ctx, dirfd, mode&0o7777))
		fd, err := openat2(dirfd, ".", how)
		if err != nil {
			return err
		}
		f = os.NewFile(uintptr(fd), "tmpfile")
		if st, id, err = fstatx(fd); err != nil {
			f.Close()
		}
		return err
	})
	if errno != 0 {
		chg.release()
		return nil, nil, 0, errno
	}
	ch := n.newChild(ctx, st, id, n.srv.meta.fid(int(f.Fd()), id), out)
	h, fl, errno := ch.Operations().(*node).opened(f, st, chg, "", 0, flags, true)
	if errno == 0 {
		n.srv.stash(ctx, h)
	}
	return ch, h, fl, errno
}
