package fs

import (
	"context"
	"strings"
	"sync"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// node is a mirrored file or directory: go-fuse's loopback node, plus the
// prefetch trigger on open, the user.gdsfs.* xattrs and read-only mode
// (readonly.go).
type node struct {
	gofs.LoopbackNode
	srv *Server

	mu       sync.Mutex
	cacheKey fileVersion // of the backing file at the last open; guarded by mu
}

// fileVersion tells whether a file changed between two opens.
type fileVersion struct {
	size         int64
	mtime, ctime syscall.Timespec
}

// newNode makes every loopback child a node (gofs.LoopbackRoot.NewNode).
func (s *Server) newNode(r *gofs.LoopbackRoot, parent *gofs.Inode, name string, st *syscall.Stat_t) gofs.InodeEmbedder {
	return &node{LoopbackNode: gofs.LoopbackNode{RootData: r}, srv: s}
}

// rel is the node's path relative to SOURCE.
func (n *node) rel() string { return n.Path(nil) }

var _ = (gofs.NodeOpener)((*node)(nil))

// Open opens the backing file and, for a regular file opened for reading,
// tells the Stager.
func (n *node) Open(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	if errno := n.srv.drain.admit(); errno != 0 {
		return nil, 0, errno
	}
	if n.srv.opts.ReadOnly && writes(flags) {
		return nil, 0, syscall.EROFS
	}
	fh, fl, errno := n.LoopbackNode.Open(ctx, flags)
	if errno != 0 {
		return nil, 0, errno
	}
	if isRegular(n.StableAttr().Mode) {
		fl |= n.keepCache(fh)
		n.srv.opens.Add(1)
		// Staging a file being written would copy bytes about to change.
		if n.srv.stager != nil && !writes(flags) {
			n.srv.stager.Opened(n.rel())
		}
	}
	return n.srv.wrapFile(fh), fl, 0
}

// keepCache lets the kernel keep the file's cached pages across opens
// (FOPEN_KEEP_CACHE) when the backing file did not change since the last
// open; a changed file starts with an empty cache. Only daemon-served reads
// use this cache: go-fuse drops the flag for passthrough opens.
func (n *node) keepCache(fh gofs.FileHandle) uint32 {
	lf, ok := fh.(*gofs.LoopbackFile)
	if !ok {
		return 0
	}
	fd, ok := lf.PassthroughFd()
	var st syscall.Stat_t
	if !ok || syscall.Fstat(fd, &st) != nil {
		return 0
	}
	v := fileVersion{size: st.Size, mtime: st.Mtim, ctime: st.Ctim}
	n.mu.Lock()
	defer n.mu.Unlock()
	same := n.cacheKey == v
	n.cacheKey = v
	if same {
		return fuse.FOPEN_KEEP_CACHE
	}
	return 0
}

var _ = (gofs.NodeCreater)((*node)(nil))

// Create creates a file in SOURCE (read-write mode only).
func (n *node) Create(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut) (*gofs.Inode, gofs.FileHandle, uint32, syscall.Errno) {
	if n.reserved(name) {
		return nil, nil, 0, syscall.EPERM
	}
	if n.srv.opts.ReadOnly {
		return nil, nil, 0, syscall.EROFS
	}
	if errno := n.srv.drain.admit(); errno != 0 {
		return nil, nil, 0, errno
	}
	in, fh, fl, errno := n.LoopbackNode.Create(ctx, name, flags, mode, out)
	if errno != 0 {
		return nil, nil, 0, errno
	}
	n.srv.opens.Add(1)
	return in, n.srv.wrapFile(fh), fl, 0
}

var _ = (gofs.NodeCopyFileRanger)((*node)(nil))

// CopyFileRange copies between backing files in the kernel.
func (n *node) CopyFileRange(ctx context.Context, fhIn gofs.FileHandle, offIn uint64, out *gofs.Inode,
	fhOut gofs.FileHandle, offOut uint64, length uint64, flags uint64) (uint32, syscall.Errno) {
	return n.LoopbackNode.CopyFileRange(ctx, unwrapFile(fhIn), offIn, out, unwrapFile(fhOut), offOut, length, flags)
}

var _ = (gofs.NodeIoctler)((*node)(nil))

// Ioctl reaches the backing file only when it cannot change anything the
// caller may not: the daemon runs it with its own privileges. Pure getters
// (_IOR, such as FS_IOC_GETFLAGS for lsattr) pass for everyone; anything
// else (chattr, enabling fs-verity) only for root on a read-write mount.
func (n *node) Ioctl(ctx context.Context, f gofs.FileHandle, cmd uint32, arg uint64, input, output []byte) (int32, syscall.Errno) {
	fio, ok := unwrapFile(f).(gofs.FileIoctler)
	if !ok {
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

const xattrPrefix = "user.gdsfs."

var _ = (gofs.NodeGetxattrer)((*node)(nil))

// Getxattr answers user.gdsfs.state and user.gdsfs.path for regular files
// and passes every other name to the backing file.
func (n *node) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	name, ok := strings.CutPrefix(attr, xattrPrefix)
	if !ok || !isRegular(n.StableAttr().Mode) {
		return n.LoopbackNode.Getxattr(ctx, attr, dest)
	}
	state, path := "absent", ""
	if n.srv.stager != nil {
		state, path = n.srv.stager.Attr(n.rel())
	}
	var v string
	switch name {
	case "state":
		v = state
	case "path":
		v = path
	}
	if v == "" {
		return 0, syscall.ENODATA
	}
	if len(dest) < len(v) {
		return uint32(len(v)), syscall.ERANGE
	}
	return uint32(copy(dest, v)), 0
}

// writes reports whether open flags ask for write access or truncation.
func writes(flags uint32) bool {
	return flags&syscall.O_ACCMODE != syscall.O_RDONLY || flags&syscall.O_TRUNC != 0
}

// rootNode is the mount's root: a node that also answers the .gdsfs lookup.
type rootNode struct {
	node
	ctl *gofs.Inode // the control directory, made in OnAdd
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
		return r.ctl, 0
	}
	return r.node.Lookup(ctx, name, out)
}

// file is an open backing file. Reads that reach the daemon (no
// passthrough) are counted.
type file struct {
	*gofs.LoopbackFile
	srv *Server
}

func (s *Server) wrapFile(fh gofs.FileHandle) gofs.FileHandle {
	if lf, ok := fh.(*gofs.LoopbackFile); ok {
		s.drain.opened() // until file.Release
		return &file{LoopbackFile: lf, srv: s}
	}
	return fh
}

func unwrapFile(fh gofs.FileHandle) gofs.FileHandle {
	if f, ok := fh.(*file); ok {
		return f.LoopbackFile
	}
	return fh
}

var _ = (gofs.FileReader)((*file)(nil))

func (f *file) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	f.srv.reads.Add(1)
	f.srv.readBytes.Add(uint64(len(dest)))
	return f.LoopbackFile.Read(ctx, dest, off)
}

var _ = (gofs.FilePassthroughFder)((*file)(nil))

// PassthroughFd offers the backing descriptor to the kernel only when
// passthrough was settled on at mount.
func (f *file) PassthroughFd() (int, bool) {
	if !f.srv.passthrough.Load() {
		return 0, false
	}
	return f.LoopbackFile.PassthroughFd()
}
