package fs

import (
	"context"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// Read-only mode is enforced here rather than with the "ro" mount option,
// which would also forbid writing the .gdsfs control files. Every method
// that changes SOURCE answers EROFS when fuse.read_only is true.

var (
	_ = (gofs.NodeSetattrer)((*node)(nil))
	_ = (gofs.NodeMknoder)((*node)(nil))
	_ = (gofs.NodeMkdirer)((*node)(nil))
	_ = (gofs.NodeRmdirer)((*node)(nil))
	_ = (gofs.NodeUnlinker)((*node)(nil))
	_ = (gofs.NodeRenamer)((*node)(nil))
	_ = (gofs.NodeSymlinker)((*node)(nil))
	_ = (gofs.NodeLinker)((*node)(nil))
	_ = (gofs.NodeSetxattrer)((*node)(nil))
	_ = (gofs.NodeRemovexattrer)((*node)(nil))
	_ = (gofs.NodeTmpfiler)((*node)(nil))
)

func (n *node) ro() bool { return n.srv.opts.ReadOnly }

// reserved reports whether name in n is the control directory's, which no
// change may touch even on a read-write mount.
func (n *node) reserved(name string) bool { return name == controlDirName && n.IsRoot() }

func (n *node) Setattr(ctx context.Context, f gofs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if n.ro() {
		return syscall.EROFS
	}
	return n.LoopbackNode.Setattr(ctx, f, in, out)
}

func (n *node) Mknod(ctx context.Context, name string, mode, rdev uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	if n.reserved(name) {
		return nil, syscall.EPERM
	}
	if n.ro() {
		return nil, syscall.EROFS
	}
	return n.LoopbackNode.Mknod(ctx, name, mode, rdev, out)
}

func (n *node) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	if n.reserved(name) {
		return nil, syscall.EPERM
	}
	if n.ro() {
		return nil, syscall.EROFS
	}
	return n.LoopbackNode.Mkdir(ctx, name, mode, out)
}

func (n *node) Rmdir(ctx context.Context, name string) syscall.Errno {
	if n.reserved(name) {
		return syscall.EPERM
	}
	if n.ro() {
		return syscall.EROFS
	}
	return n.LoopbackNode.Rmdir(ctx, name)
}

func (n *node) Unlink(ctx context.Context, name string) syscall.Errno {
	if n.reserved(name) {
		return syscall.EPERM
	}
	if n.ro() {
		return syscall.EROFS
	}
	return n.LoopbackNode.Unlink(ctx, name)
}

func (n *node) Rename(ctx context.Context, name string, newParent gofs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	if p, ok := newParent.(*rootNode); n.reserved(name) || ok && p.reserved(newName) {
		return syscall.EPERM
	}
	if n.ro() {
		return syscall.EROFS
	}
	return n.LoopbackNode.Rename(ctx, name, newParent, newName, flags)
}

func (n *node) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	if n.reserved(name) {
		return nil, syscall.EPERM
	}
	if n.ro() {
		return nil, syscall.EROFS
	}
	return n.LoopbackNode.Symlink(ctx, target, name, out)
}

func (n *node) Link(ctx context.Context, target gofs.InodeEmbedder, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	if n.reserved(name) {
		return nil, syscall.EPERM
	}
	if n.ro() {
		return nil, syscall.EROFS
	}
	return n.LoopbackNode.Link(ctx, target, name, out)
}

func (n *node) Setxattr(ctx context.Context, attr string, data []byte, flags uint32) syscall.Errno {
	if n.ro() {
		return syscall.EROFS
	}
	return n.LoopbackNode.Setxattr(ctx, attr, data, flags)
}

func (n *node) Removexattr(ctx context.Context, attr string) syscall.Errno {
	if n.ro() {
		return syscall.EROFS
	}
	return n.LoopbackNode.Removexattr(ctx, attr)
}

func (n *node) Tmpfile(ctx context.Context, flags, mode uint32, out *fuse.EntryOut) (*gofs.Inode, gofs.FileHandle, uint32, syscall.Errno) {
	if n.ro() {
		return nil, nil, 0, syscall.EROFS
	}
	if errno := n.srv.drain.admit(); errno != 0 {
		return nil, nil, 0, errno
	}
	in, fh, fl, errno := n.LoopbackNode.Tmpfile(ctx, flags, mode, out)
	if errno != 0 {
		return nil, nil, 0, errno
	}
	return in, n.srv.wrapFile(fh), fl, 0
}
