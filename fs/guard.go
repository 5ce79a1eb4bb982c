package fs

import (
	"github.com/hanwen/go-fuse/v2/fuse"
)

// The requests umaskFS passes to go-fuse's node layer through kernelRefs
// (kernelrefs.go): each names its node ids and handles; entry replies,
// opens, releases and forgets update the tables.

func (u *umaskFS) Lookup(cancel <-chan struct{}, h *fuse.InHeader, name string, out *fuse.EntryOut) fuse.Status {
	if st := u.refs.enter(h.NodeId, 0, 0, 0); !st.Ok() {
		return st
	}
	defer u.refs.exit()
	st := u.RawFileSystem.Lookup(cancel, h, name, out)
	u.refs.entry(st, out)
	return st
}

func (u *umaskFS) Forget(id, n uint64) {
	if st := u.refs.enter(0, 0, 0, 0); !st.Ok() {
		return
	}
	defer u.refs.exit()
	if n = u.refs.forget(id, n); n > 0 {
		u.RawFileSystem.Forget(id, n)
	}
}

func (u *umaskFS) GetAttr(cancel <-chan struct{}, in *fuse.GetAttrIn, out *fuse.AttrOut) fuse.Status {
	if in.Flags_&fuse.FUSE_GETATTR_FH != 0 && !u.refs.holds(in.NodeId, in.Fh_) {
		// A handle a dead predecessor opened (fstat of a file open
		// across a crash): the node's attributes do as well.
		in.Flags_ &^= fuse.FUSE_GETATTR_FH
		in.Fh_ = 0
	}
	if st := u.refs.enter(in.NodeId, 0, in.Fh(), 0); !st.Ok() {
		return st
	}
	defer u.refs.exit()
	return u.RawFileSystem.GetAttr(cancel, in, out)
}

func (u *umaskFS) SetAttr(cancel <-chan struct{}, in *fuse.SetAttrIn, out *fuse.AttrOut) fuse.Status {
	fh, _ := in.GetFh()
	if st := u.refs.enter(in.NodeId, 0, fh, 0); !st.Ok() {
		return st
	}
	defer u.refs.exit()
	return u.RawFileSystem.SetAttr(cancel, in, out)
}

func (u *umaskFS) Unlink(cancel <-chan struct{}, h *fuse.InHeader, name string) fuse.Status {
	if st := u.refs.enter(h.NodeId, 0, 0, 0); !st.Ok() {
		return st
	}
	defer u.refs.exit()
	return u.RawFileSystem.Unlink(cancel, h, name)
}

func (u *umaskFS) Rmdir(cancel <-chan struct{}, h *fuse.InHeader, name string) fuse.Status {
	if st := u.refs.enter(h.NodeId, 0, 0, 0); !st.Ok() {
		return st
	}
	defer u.refs.exit()
	return u.RawFileSystem.Rmdir(cancel, h, name)
}

func (u *umaskFS) Rename(cancel <-chan struct{}, in *fuse.RenameIn, oldName, newName string) fuse.Status {
	if st := u.refs.enter(in.NodeId, in.Newdir, 0, 0); !st.Ok() {
		return st
	}
	defer u.refs.exit()
	return u.RawFileSystem.Rename(cancel, in, oldName, newName)
}

func (u *umaskFS) Link(cancel <-chan struct{}, in *fuse.LinkIn, name string, out *fuse.EntryOut) fuse.Status {
	if st := u.refs.enter(in.NodeId, in.Oldnodeid, 0, 0); !st.Ok() {
		return st
	}
	defer u.refs.exit()
	st := u.RawFileSystem.Link(cancel, in, name, out)
	u.refs.entry(st, out)
	return st
}

func (u *umaskFS) Symlink(cancel <-chan struct{}, h *fuse.InHeader, target, name string, out *fuse.EntryOut) fuse.Status {
	if st := u.refs.enter(h.NodeId, 0, 0, 0); !st.Ok() {
		return st
	}
	defer u.refs.exit()
	st := u.RawFileSystem.Symlink(cancel, h, target, name, out)
	u.refs.entry(st, out)
	return st
}

func (u *umaskFS) Readlink(cancel <-chan struct{}, h *fuse.InHeader) ([]byte, fuse.Status) {
	if st := u.refs.enter(h.NodeId, 0, 0, 0); !st.Ok() {
		return nil, st
	}
	defer u.refs.exit()
	return u.RawFileSystem.Readlink(cancel, h)
}

func (u *umaskFS) Access(cancel <-chan struct{}, in *fuse.AccessIn) fuse.Status {
	if st := u.refs.enter(in.NodeId, 0, 0, 0); !st.Ok() {
		return st
	}
	defer u.refs.exit()
	return u.RawFileSystem.Access(cancel, in)
}

func (u *umaskFS) GetXAttr(cancel <-chan struct{}, h *fuse.InHeader, attr string, dest []byte) (uint32, fuse.Status) {
	if st := u.refs.enter(h.NodeId, 0, 0, 0); !st.Ok() {
		return 0, st
	}
	defer u.refs.exit()
	return u.RawFileSystem.GetXAttr(cancel, h, attr, dest)
}

func (u *umaskFS) ListXAttr(cancel <-chan struct{}, h *fuse.InHeader, dest []byte) (uint32, fuse.Status) {
	if st := u.refs.enter(h.NodeId, 0, 0, 0); !st.Ok() {
		return 0, st
	}
	defer u.refs.exit()
	return u.RawFileSystem.ListXAttr(cancel, h, dest)
}

func (u *umaskFS) SetXAttr(cancel <-chan struct{}, in *fuse.SetXAttrIn, attr string, data []byte) fuse.Status {
	if st := u.refs.enter(in.NodeId, 0, 0, 0); !st.Ok() {
		return st
	}
	defer u.refs.exit()
	return u.RawFileSystem.SetXAttr(cancel, in, attr, data)
}

func (u *umaskFS) RemoveXAttr(cancel <-chan struct{}, h *fuse.InHeader, attr string) fuse.Status {
	if st := u.refs.enter(h.NodeId, 0, 0, 0); !st.Ok() {
		return st
	}
	defer u.refs.exit()
	return u.RawFileSystem.RemoveXAttr(cancel, h, attr)
}

func (u *umaskFS) Open(cancel <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	if st := u.refs.enter(in.NodeId, 0, 0, 0); !st.Ok() {
		return st
	}
	defer u.refs.exit()
	st := u.RawFileSystem.Open(cancel, in, out)
	u.refs.opened(cancel, st, nil, in.NodeId, out)
	return st
}

func (u *umaskFS) Read(cancel <-chan struct{}, in *fuse.ReadIn, buf []byte) (fuse.ReadResult, fuse.Status) {
	if st := u.refs.enter(in.NodeId, 0, in.Fh, 0); !st.Ok() {
		return nil, st
	}
	defer u.refs.exit()
	return u.RawFileSystem.Read(cancel, in, buf)
}

func (u *umaskFS) Lseek(cancel <-chan struct{}, in *fuse.LseekIn, out *fuse.LseekOut) fuse.Status {
	if st := u.refs.enter(in.NodeId, 0, in.Fh, 0); !st.Ok() {
		return st
	}
	defer u.refs.exit()
	return u.RawFileSystem.Lseek(cancel, in, out)
}

func (u *umaskFS) GetLk(cancel <-chan struct{}, in *fuse.LkIn, out *fuse.LkOut) fuse.Status {
	if st := u.refs.enter(in.NodeId, 0, in.Fh, 0); !st.Ok() {
		return st
	}
	defer u.refs.exit()
	return u.RawFileSystem.GetLk(cancel, in, out)
}

func (u *umaskFS) SetLk(cancel <-chan struct{}, in *fuse.LkIn) fuse.Status {
	if st := u.refs.enter(in.NodeId, 0, in.Fh, 0); !st.Ok() {
		return st
	}
	defer u.refs.exit()
	return u.RawFileSystem.SetLk(cancel, in)
}

func (u *umaskFS) SetLkw(cancel <-chan struct{}, in *fuse.LkIn) fuse.Status {
	if st := u.refs.enter(in.NodeId, 0, in.Fh, 0); !st.Ok() {
		return st
	}
	defer u.refs.exit()
	return u.RawFileSystem.SetLkw(cancel, in)
}

func (u *umaskFS) Release(cancel <-chan struct{}, in *fuse.ReleaseIn) {
	if u.releaseDead(in) {
		return
	}
	if st := u.refs.enter(in.NodeId, 0, in.Fh, 0); !st.Ok() {
		return
	}
	defer u.refs.exit()
	if u.refs.release(in.Fh) {
		u.RawFileSystem.Release(cancel, in)
	}
}

func (u *umaskFS) Write(cancel <-chan struct{}, in *fuse.WriteIn, data []byte) (uint32, fuse.Status) {
	if st := u.refs.enter(in.NodeId, 0, in.Fh, 0); !st.Ok() {
		return 0, st
	}
	defer u.refs.exit()
	return u.RawFileSystem.Write(cancel, in, data)
}

func (u *umaskFS) Writev(cancel <-chan struct{}, in *fuse.WriteIn, data [][]byte) (uint32, fuse.Status) {
	if st := u.refs.enter(in.NodeId, 0, in.Fh, 0); !st.Ok() {
		return 0, st
	}
	defer u.refs.exit()
	return u.RawFileSystem.Writev(cancel, in, data)
}

func (u *umaskFS) CopyFileRange(cancel <-chan struct{}, in *fuse.CopyFileRangeIn) (uint32, fuse.Status) {
	if st := u.refs.enter(in.NodeId, in.NodeIdOut, in.FhIn, in.FhOut); !st.Ok() {
		return 0, st
	}
	defer u.refs.exit()
	return u.RawFileSystem.CopyFileRange(cancel, in)
}

func (u *umaskFS) Ioctl(cancel <-chan struct{}, in *fuse.IoctlIn, inbuf []byte, out *fuse.IoctlOut, outbuf []byte) fuse.Status {
	if st := u.refs.enter(in.NodeId, 0, in.Fh, 0); !st.Ok() {
		return st
	}
	defer u.refs.exit()
	return u.RawFileSystem.Ioctl(cancel, in, inbuf, out, outbuf)
}

func (u *umaskFS) Flush(cancel <-chan struct{}, in *fuse.FlushIn) fuse.Status {
	if !u.refs.holds(in.NodeId, in.Fh) {
		// A handle a dead predecessor opened: this daemon holds nothing
		// of it to flush (writes go to SOURCE as they come), and the
		// caller's close must not fail.
		if st := u.refs.enter(0, 0, 0, 0); !st.Ok() {
			return st
		}
		u.refs.exit()
		return fuse.OK
	}
	if st := u.refs.enter(in.NodeId, 0, in.Fh, 0); !st.Ok() {
		return st
	}
	defer u.refs.exit()
	return u.RawFileSystem.Flush(cancel, in)
}

func (u *umaskFS) Fsync(cancel <-chan struct{}, in *fuse.FsyncIn) fuse.Status {
	if st := u.refs.enter(in.NodeId, 0, in.Fh, 0); !st.Ok() {
		return st
	}
	defer u.refs.exit()
	return u.RawFileSystem.Fsync(cancel, in)
}

func (u *umaskFS) Fallocate(cancel <-chan struct{}, in *fuse.FallocateIn) fuse.Status {
	if st := u.refs.enter(in.NodeId, 0, in.Fh, 0); !st.Ok() {
		return st
	}
	defer u.refs.exit()
	return u.RawFileSystem.Fallocate(cancel, in)
}

func (u *umaskFS) OpenDir(cancel <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	if st := u.refs.enter(in.NodeId, 0, 0, 0); !st.Ok() {
		return st
	}
	defer u.refs.exit()
	st := u.RawFileSystem.OpenDir(cancel, in, out)
	u.refs.opened(cancel, st, nil, in.NodeId, out)
	return st
}

func (u *umaskFS) ReadDir(cancel <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	if st := u.refs.enter(in.NodeId, 0, in.Fh, 0); !st.Ok() {
		return st
	}
	defer u.refs.exit()
	return u.RawFileSystem.ReadDir(cancel, in, out)
}

// ReadDirPlus: go-fuse looks each entry up through the node layer, which
// counts the references (node.Lookup).
func (u *umaskFS) ReadDirPlus(cancel <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	if st := u.refs.enter(in.NodeId, 0, in.Fh, 0); !st.Ok() {
		return st
	}
	defer u.refs.exit()
	u.refs.plus.Store(cancel, struct{}{})
	defer u.refs.plus.Delete(cancel)
	return u.RawFileSystem.ReadDirPlus(cancel, in, out)
}

func (u *umaskFS) ReleaseDir(in *fuse.ReleaseIn) {
	if u.releaseDead(in) {
		return
	}
	if st := u.refs.enter(in.NodeId, 0, in.Fh, 0); !st.Ok() {
		return
	}
	defer u.refs.exit()
	if u.refs.release(in.Fh) {
		u.RawFileSystem.ReleaseDir(in)
	}
}

func (u *umaskFS) FsyncDir(cancel <-chan struct{}, in *fuse.FsyncIn) fuse.Status {
	if st := u.refs.enter(in.NodeId, 0, in.Fh, 0); !st.Ok() {
		return st
	}
	defer u.refs.exit()
	return u.RawFileSystem.FsyncDir(cancel, in)
}

func (u *umaskFS) StatFs(cancel <-chan struct{}, h *fuse.InHeader, out *fuse.StatfsOut) fuse.Status {
	if st := u.refs.enter(h.NodeId, 0, 0, 0); !st.Ok() {
		return st
	}
	defer u.refs.exit()
	return u.RawFileSystem.StatFs(cancel, h, out)
}

func (u *umaskFS) Statx(cancel <-chan struct{}, in *fuse.StatxIn, out *fuse.StatxOut) fuse.Status {
	var fh uint64
	if in.GetattrFlags&fuse.FUSE_GETATTR_FH != 0 {
		fh = in.Fh
	}
	if fh != 0 && !u.refs.holds(in.NodeId, fh) {
		// As in GetAttr: a handle a dead predecessor opened.
		in.GetattrFlags &^= fuse.FUSE_GETATTR_FH
		in.Fh, fh = 0, 0
	}
	if st := u.refs.enter(in.NodeId, 0, fh, 0); !st.Ok() {
		return st
	}
	defer u.refs.exit()
	return u.RawFileSystem.Statx(cancel, in, out)
}

// releaseDead frees the number of a dead predecessor's handle the kernel
// lets go of (held back on the root by adoptHandles, so that no handle of
// this daemon takes it while the kernel names it); false for any other.
func (u *umaskFS) releaseDead(in *fuse.ReleaseIn) bool {
	if st := u.refs.enter(0, 0, 0, 0); !st.Ok() {
		return true
	}
	defer u.refs.exit()
	if !u.refs.releaseDead(in.Fh) {
		return false
	}
	u.RawFileSystem.Release(nil, &fuse.ReleaseIn{InHeader: fuse.InHeader{NodeId: fuse.FUSE_ROOT_ID}, Fh: in.Fh})
	return true
}
