package fs

import (
	"context"
	"sync"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// The caller's umask is applied exactly once, as natively: the mount
// negotiates FUSE_DONT_MASK, so the kernel passes a new entry's mode
// unmasked with the caller's umask beside it; the daemon applies that
// umask unless the directory has a default ACL, which then decides alone
// (as the kernel's posix_acl_create does). The daemon's own umask is 0
// (Mount), so SOURCE's filesystem applies nothing more.

// umaskFS hands a creating request's umask to the node that serves it:
// go-fuse's node API passes the mode but drops the umask. The request's
// cancel channel, unique among requests in flight, is the key.
type umaskFS struct {
	fuse.RawFileSystem
	umasks sync.Map // <-chan struct{} -> uint32
	refs   kernelRefs
}

func (u *umaskFS) with(cancel <-chan struct{}, umask uint32, fn func() fuse.Status) fuse.Status {
	u.umasks.Store(cancel, umask)
	defer u.umasks.Delete(cancel)
	return fn()
}

func (u *umaskFS) Create(cancel <-chan struct{}, in *fuse.CreateIn, name string, out *fuse.CreateOut) fuse.Status {
	if st := u.refs.enter(in.NodeId, 0, 0, 0); !st.Ok() {
		return st
	}
	defer u.refs.exit()
	st := u.with(cancel, in.Umask, func() fuse.Status { return u.RawFileSystem.Create(cancel, in, name, out) })
	u.refs.opened(cancel, st, &out.EntryOut, out.NodeId, &out.OpenOut)
	return st
}

func (u *umaskFS) Tmpfile(cancel <-chan struct{}, in *fuse.CreateIn, out *fuse.CreateOut) fuse.Status {
	if st := u.refs.enter(in.NodeId, 0, 0, 0); !st.Ok() {
		return st
	}
	defer u.refs.exit()
	st := u.with(cancel, in.Umask, func() fuse.Status { return u.RawFileSystem.Tmpfile(cancel, in, out) })
	u.refs.opened(cancel, st, &out.EntryOut, out.NodeId, &out.OpenOut)
	return st
}

func (u *umaskFS) Mkdir(cancel <-chan struct{}, in *fuse.MkdirIn, name string, out *fuse.EntryOut) fuse.Status {
	if st := u.refs.enter(in.NodeId, 0, 0, 0); !st.Ok() {
		return st
	}
	defer u.refs.exit()
	st := u.with(cancel, in.Umask, func() fuse.Status { return u.RawFileSystem.Mkdir(cancel, in, name, out) })
	u.refs.entry(st, out)
	return st
}

func (u *umaskFS) Mknod(cancel <-chan struct{}, in *fuse.MknodIn, name string, out *fuse.EntryOut) fuse.Status {
	if st := u.refs.enter(in.NodeId, 0, 0, 0); !st.Ok() {
		return st
	}
	defer u.refs.exit()
	st := u.with(cancel, in.Umask, func() fuse.Status { return u.RawFileSystem.Mknod(cancel, in, name, out) })
	u.refs.entry(st, out)
	return st
}

// safeUmask is assumed for a request whose umask is unknown (there is
// none: every creating request passes through umaskFS).
const safeUmask = 0o077

// createMode is the mode to create an entry with in dirfd: mode less the
// caller's umask, unless dirfd has a default ACL.
func (s *Server) createMode(ctx context.Context, dirfd int, mode uint32) uint32 {
	if n, err := unix.Getxattr(procPath(dirfd), aclDefault, nil); err == nil && n > 0 {
		return mode
	}
	umask := uint32(safeUmask)
	if fc, ok := ctx.(*fuse.Context); ok {
		if v, ok := s.raw.umasks.Load(fc.Cancel); ok {
			umask = v.(uint32)
		}
	}
	return mode &^ umask
}
