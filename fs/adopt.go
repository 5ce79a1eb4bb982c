package fs

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/staging/watch"
)

// Adopt prepares a server for the mount a predecessor handed over
// (Handoff) on its FUSE connection: the kernel keeps its node ids and
// file handles. What it cannot take over (a node whose file is not where
// it was, a handle of a dropped node) it drops with a log line; the
// kernel then gets ESTALE or EBADF for it. The server reads nothing from
// the connection until Serve: the predecessor may still serve it. One
// that is never served is let go with Abandon. Adopt dups what it keeps:
// the caller closes files.
func Adopt(cfg Config, st FUSEState, files []*os.File) (*Server, error) {
	if st.Version != FUSEStateVersion && st.Version != 1 {
		return nil, fmt.Errorf("fuse hand-over: state version %d, this daemon reads versions 1 to %d", st.Version, FUSEStateVersion)
	}
	if err := cfg.Options.Validate(); err != nil {
		return nil, err
	}
	if err := sameConnection(cfg.Options, st); err != nil {
		return nil, err
	}
	if st.FUSE < 0 || st.FUSE >= len(files) {
		return nil, fmt.Errorf("fuse hand-over: no FUSE descriptor (index %d of %d files)", st.FUSE, len(files))
	}
	source, err := filepath.EvalSymlinks(cfg.Source)
	if err == nil {
		source, err = filepath.Abs(source)
	}
	if err != nil {
		return nil, fmt.Errorf("SOURCE %s: %w", cfg.Source, unwrapPath(err))
	}
	mnt, err := filepath.Abs(cfg.Mountpoint)
	if err != nil || mnt != st.Mountpoint {
		return nil, fmt.Errorf("MOUNTPOINT %s: the predecessor serves %s", cfg.Mountpoint, st.Mountpoint)
	}
	s, err := prepare(cfg, source, mnt)
	if err != nil {
		return nil, err
	}
	var srcSt unix.Stat_t
	s.root.At(func(dirfd int) error { return unix.Fstat(dirfd, &srcSt) })
	if srcSt.Dev != st.SourceDev || srcSt.Ino != st.SourceIno {
		s.letSourceGo()
		return nil, fmt.Errorf("SOURCE %s: not the directory the predecessor serves (%s)", cfg.Source, st.Source)
	}
	s.ids.restore(st.Foreign, st.ForeignNext)
	var unknown []uint64 // node ids the kernel may hold that no adopted node answers for
	if st.Died {
		// The table died with the predecessor: new numbers start past
		// any it can have handed out (at most one a nanosecond).
		s.ids.restore(nil, uint64(time.Now().UnixNano()))
		if st.Journal > 0 && st.Journal < len(files) {
			recs, fh, err := readJournal(files[st.Journal])
			if err != nil {
				s.log.Warn("node journal not read: the nodes the kernel held are unknown here", zap.Error(err))
			}
			var found []NodeState
			found, unknown = s.journalNodes(recs)
			st.Nodes = append(st.Nodes, found...)
			if fh > maxDeadHandles {
				s.log.Warn("node journal: more handle numbers than are held back", zap.Uint64("highest", fh), zap.Int("held_back", maxDeadHandles))
				fh = maxDeadHandles
			}
			st.deadHandles = fh
		}
	}
	if err := s.adoptConnection(st, files); err != nil {
		s.letSourceGo()
		return nil, fmt.Errorf("fuse hand-over: %w", err)
	}
	s.pending.unknown = unknown
	return s, nil
}

// sameConnection checks that o sets the connection up as the
// predecessor's options did.
func sameConnection(o Options, st FUSEState) error {
	switch {
	case int64(o.MaxRead) != st.MaxRead:
		return fmt.Errorf("fuse.max_read: %s, but the mount was set up with %d bytes; a restart with another value needs a new mount", o.MaxRead, st.MaxRead)
	case (o.Passthrough == PassthroughOff) != (st.Passthrough == PassthroughOff):
		return fmt.Errorf("fuse.passthrough: %s, but the mount was set up with %s; a restart with another value needs a new mount", o.Passthrough, st.Passthrough)
	case o.AllowOther != st.AllowOther:
		return fmt.Errorf("fuse.allow_other: %v, but the mount was set up with %v; a restart with another value needs a new mount", o.AllowOther, st.AllowOther)
	case !slices.Equal(o.MountFlags, st.MountFlags):
		return fmt.Errorf("fuse.mount_flags: %q, but the mount was set up with %q; a restart with other flags needs a new mount", o.MountFlags, st.MountFlags)
	}
	return nil
}

// adoptConnection starts go-fuse on a socket pair that carries the
// kernel's INIT and registers the predecessor's nodes and handles; it
// keeps a dup of the connection for Serve.
func (s *Server) adoptConnection(st FUSEState, files []*os.File) error {
	opts := s.mountOptions()
	opts.DirectMount, opts.DirectMountStrict = false, false
	s.newTree(opts)
	fdMu.Lock()
	sp, err := seqpacket()
	if err != nil {
		fdMu.Unlock()
		return err
	}
	if _, err := unix.Write(sp[1], initRequest(st.Kernel)); err != nil {
		unix.Close(sp[0])
		unix.Close(sp[1])
		fdMu.Unlock()
		return fmt.Errorf("INIT: %w", err)
	}
	srv, err := fuse.NewServer(s.raw, fmt.Sprintf("/dev/fd/%d", sp[0]), &opts.MountOptions)
	fdMu.Unlock()
	if err != nil { // go-fuse closed sp[0]
		unix.Close(sp[1])
		return fmt.Errorf("INIT: %w", err)
	}
	s.fuse, s.fuseFd, s.adopted = srv, sp[0], true
	p := &pendingConn{conn: -1, kernel: st.Kernel, died: st.Died}
	s.pending = p
	buf := make([]byte, 4096)
	n, err := unix.Read(sp[1], buf)
	unix.Close(sp[1]) // sp[0] waits unread for Serve to replace it
	if err == nil {
		_, err = initReply(buf[:n])
	}
	if err == nil {
		err = s.adoptTree(st, files)
	}
	if err == nil {
		p.conn, err = unix.FcntlInt(files[st.FUSE].Fd(), unix.F_DUPFD_CLOEXEC, 0)
	}
	if err != nil {
		s.releaseUnserved()
		return err
	}
	s.mountDev.Store(st.MountDev)
	return nil
}

// pendingConn is what Adopt prepared for Serve.
type pendingConn struct {
	conn   int // a dup of the connection, -1: none yet
	kernel KernelInit
	died   bool       // the predecessor died (FUSEState.Died)
	kept   []*os.File // nodes' kept files (replaced.go), to close if never served
	// unknown are the node ids of a dead predecessor's journal not found
	// again (journal.go): the kernel may hold them.
	unknown []uint64
}

// Serve starts serving the connection Adopt prepared: go-fuse reads the
// kernel's requests from now on. The caller must know the predecessor
// let the connection go (it reads from it no more). A server that serves
// already (made by Mount, or served before) is left as it is.
func (s *Server) Serve() error {
	s.hoMu.Lock()
	defer s.hoMu.Unlock()
	p := s.pending
	if p == nil {
		return nil
	}
	if err := unix.Dup3(p.conn, s.fuseFd, unix.O_CLOEXEC); err != nil {
		return fmt.Errorf("fuse hand-over: serving the connection: %w", err)
	}
	s.pending = nil
	unix.Close(p.conn)
	// Before go-fuse reads: every request read and not answered is the
	// predecessor's.
	s.resend(p.kernel, p.died)
	s.goServe(s.fuse)
	if err := s.settlePassthrough(); err != nil {
		s.log.Warn("fuse hand-over: passthrough for new opens", zap.Error(err))
	}
	s.startMeta()
	s.adoptMeta()
	s.meta.adopted(p.unknown)
	return nil
}

// releaseUnserved lets go of what Adopt took, before Serve: go-fuse
// starts, reads an error and stops, and the dups of the adopted handles,
// kept files and the connection are closed. Nothing it does reaches the
// connection, nor a passthrough backing id registered on it: the
// predecessor serves on with them.
func (s *Server) releaseUnserved() {
	p := s.pending
	s.pending = nil
	// A directory reads EISDIR, which go-fuse logs at debug level (the
	// socket's end-of-file it would log on stderr).
	if dir, err := unix.Open("/", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err == nil {
		unix.Dup3(dir, s.fuseFd, unix.O_CLOEXEC)
		unix.Close(dir)
	}
	s.goServe(s.fuse)
	<-s.served
	if p.conn >= 0 {
		unix.Close(p.conn)
	}
	for _, f := range p.kept {
		f.Close()
	}
	s.releaseHandles()
}

// resend asks the kernel to send again the requests the predecessor
// read and did not answer (FUSE_NOTIFY_RESEND, Linux 6.9): a dead one's,
// and those a live one read in the instant it let go (kernelrefs.go).
// The predecessor answers nothing any more.
func (s *Server) resend(k KernelInit, died bool) {
	if !canResend(k) {
		if !died {
			return // a live predecessor answered all it read (kernelrefs.go)
		}
		s.log.Warn("fuse hand-over: the kernel cannot resend requests the predecessor read and did not answer (needs Linux >= 6.9): their callers wait until the mount ends")
		return
	}
	const notifyResend = 7
	if _, err := unix.Write(s.fuseFd, notification(notifyResend)); err != nil {
		s.log.Warn("fuse hand-over: resending the predecessor's requests", zap.Error(err))
	}
}

// canResend reports whether the kernel k resends on FUSE_NOTIFY_RESEND.
func canResend(k KernelInit) bool {
	return (uint64(k.Flags)|uint64(k.Flags2)<<32)&fuse.CAP_HAS_RESEND != 0
}

// adoptNodes are the nodes LookupNode returns while adoptTree registers
// them (nil otherwise: set and cleared before serving).
type adoptNodes map[uint64]*gofs.Inode

var _ = (gofs.NodeLookupNoder)((*rootNode)(nil))

// LookupNode answers a LOOKUP of "." for a node id the daemon does not
// hold: one Adopt is registering, else ESTALE.
func (r *rootNode) LookupNode(ctx context.Context, id uint64, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	if in := r.adoptNodes[id]; in != nil {
		return in, 0
	}
	return nil, syscall.ESTALE
}

// adoptTree rebuilds the predecessor's nodes with their kernel lookup
// counts, then its handles under their numbers.
func (s *Server) adoptTree(st FUSEState, files []*os.File) error {
	ctx := context.Background()
	root := s.tree.EmbeddedInode()
	built := adoptNodes{fuse.FUSE_ROOT_ID: root}
	s.tree.adoptNodes = built
	defer func() { s.tree.adoptNodes = nil }()
	bridge := s.raw.RawFileSystem
	for _, ns := range st.Nodes {
		in, why := s.adoptNode(ctx, built, ns, files)
		if in == nil {
			s.log.Info("fuse hand-over: node dropped", zap.Uint64("node", ns.ID), zap.String("name", ns.Name), zap.String("why", why))
			continue
		}
		built[ns.ID] = in
		for range ns.Lookups {
			var out fuse.EntryOut
			if code := bridge.Lookup(nil, &fuse.InHeader{NodeId: ns.ID}, ".", &out); !code.Ok() {
				return fmt.Errorf("registering node %d: %v", ns.ID, code)
			}
		}
		if ns.Lookups > 0 {
			s.raw.refs.ref(ns.ID, ns.Lookups)
		}
	}
	return s.adoptHandles(st, built, files)
}

// adoptNode makes the node ns in the tree, or says why not.
func (s *Server) adoptNode(ctx context.Context, built adoptNodes, ns NodeState, files []*os.File) (*gofs.Inode, string) {
	if ns.ID >= controlIno {
		ctl := s.tree.ctl
		if ns.ID == controlIno {
			return ctl, ""
		}
		for _, ch := range ctl.Children() {
			if ch.StableAttr().Ino == ns.ID {
				return ch, ""
			}
		}
		return nil, "no such control file here"
	}
	if s.ids.of(ns.Dev, ns.Ino) != ns.ID {
		return nil, "its node id is not this daemon's for the file"
	}
	parent := built[ns.Parent]
	if ns.Parent == 0 {
		parent = built[fuse.FUSE_ROOT_ID]
	} else if parent == nil {
		return nil, "its directory was dropped"
	}
	n := &node{srv: s, id: fileID{dev: ns.Dev, ino: ns.Ino, gen: ns.Gen}, fid: watch.FID(ns.FID)}
	n.seen = fileVersion{size: ns.Size, mtime: syscall.NsecToTimespec(ns.Mtime), ctime: syscall.NsecToTimespec(ns.Ctime)}
	if ns.Kept >= 0 && ns.Kept < len(files) && s.fds.keep() {
		if f, err := dupFile(files[ns.Kept]); err == nil {
			n.kept = f
			s.pending.kept = append(s.pending.kept, f)
		} else {
			s.fds.unkeep()
		}
	}
	in := parent.NewInode(ctx, n, gofs.StableAttr{Mode: ns.Mode, Ino: ns.ID, Gen: ns.Gen})
	if ns.Parent != 0 && ns.Name != "" {
		parent.AddChild(ns.Name, in, false)
	}
	return in, ""
}

// gapHandle fills a handle number no adopted handle has, while
// adoptHandles registers handles in order.
type gapHandle struct{}

// adoptHandles registers the predecessor's handles under the numbers the
// kernel holds: go-fuse hands out the lowest free number, so the numbers
// in between are taken by gap handles and released after. After a crash,
// the numbers up to st.deadHandles stay taken (on the root, node 0 in
// kernelRefs) until the kernel releases them: it may name the dead
// daemon's handles by them, and no handle of this daemon may answer.
func (s *Server) adoptHandles(st FUSEState, built adoptNodes, files []*os.File) error {
	byFh := map[uint64]HandleState{}
	maxFh := st.deadHandles
	for _, h := range st.Handles {
		byFh[h.Fh] = h
		maxFh = max(maxFh, h.Fh)
	}
	bridge := s.raw.RawFileSystem
	var gaps []uint64
	for fh := uint64(1); fh <= maxFh; fh++ {
		hs, ok := byFh[fh]
		var h gofs.FileHandle = gapHandle{}
		node, dir := uint64(fuse.FUSE_ROOT_ID), false
		if ok {
			if ah, why := s.adoptHandle(built, hs, files); ah != nil {
				h, node, dir = ah, hs.Node, hs.Dir
			} else {
				s.log.Info("fuse hand-over: handle dropped", zap.Uint64("fh", fh), zap.String("path", hs.Rel), zap.String("why", why))
			}
		}
		s.adopting.Store(&h)
		var out fuse.OpenOut
		in := &fuse.OpenIn{InHeader: fuse.InHeader{NodeId: node}}
		var code fuse.Status
		if dir {
			code = bridge.OpenDir(nil, in, &out)
		} else {
			code = bridge.Open(nil, in, &out)
		}
		s.adopting.Store(nil)
		if !code.Ok() || out.Fh != fh {
			return fmt.Errorf("registering handle %d: %v, got handle %d", fh, code, out.Fh)
		}
		if _, gap := h.(gapHandle); gap {
			if fh <= st.deadHandles {
				s.raw.refs.mu.Lock()
				s.raw.refs.fhs[fh] = fhRef{h: h}
				s.raw.refs.mu.Unlock()
			} else {
				gaps = append(gaps, fh)
			}
			continue
		}
		s.raw.refs.mu.Lock()
		s.raw.refs.fhs[fh] = fhRef{node: node, h: h}
		s.raw.refs.mu.Unlock()
	}
	for _, fh := range gaps {
		bridge.Release(nil, &fuse.ReleaseIn{InHeader: fuse.InHeader{NodeId: fuse.FUSE_ROOT_ID}, Fh: fh})
	}
	// The kernel may name the numbers up to maxFh: a crash of this
	// daemon must hold them back too.
	if s.raw.refs.noteFh != nil && maxFh > 0 {
		s.raw.refs.noteFh(maxFh)
	}
	return nil
}

// adoptHandle makes the handle hs on its node, or says why not.
func (s *Server) adoptHandle(built adoptNodes, hs HandleState, files []*os.File) (gofs.FileHandle, string) {
	in := built[hs.Node]
	if in == nil {
		return nil, "its node was dropped"
	}
	n := asNode(in.Operations())
	if n == nil || hs.File < 0 || hs.File >= len(files) {
		return nil, "not a file of SOURCE"
	}
	var ch *charge
	if hs.Charged {
		ch = s.fds.adopt(hs.UID)
	}
	if hs.Dir {
		fd, err := unix.FcntlInt(files[hs.File].Fd(), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			ch.release()
			return nil, err.Error()
		}
		ds, errno := gofs.NewLoopbackDirStreamFd(fd) // the stream owns fd
		stream, ok := ds.(dirStream)
		if errno != 0 || !ok {
			unix.Close(fd)
			ch.release()
			return nil, fmt.Sprintf("directory stream: %v", errno)
		}
		return &dirHandle{dirStream: stream, charge: ch, fd: fd}, ""
	}
	f, err := dupFile(files[hs.File])
	if err != nil {
		ch.release()
		return nil, err.Error()
	}
	h := &file{LoopbackFile: gofs.NewLoopbackFileFromOS(f), srv: s, node: n, rel: hs.Rel, charge: ch,
		writable: hs.Writable, reading: hs.Reading, written: hs.Written, adopted: true}
	if hs.BackingID != 0 {
		n.backing = hs.BackingID
	}
	n.mu.Lock()
	if n.open == nil {
		n.open = map[*file]struct{}{}
	}
	n.open[h] = struct{}{}
	n.mu.Unlock()
	s.drain.opened()
	return h, ""
}

// adoptMeta lets change detection find the adopted nodes.
func (s *Server) adoptMeta() {
	if !s.meta.on {
		return
	}
	var walk func(in *gofs.Inode)
	walk = func(in *gofs.Inode) {
		for _, ch := range in.Children() {
			if n := asNode(ch.Operations()); n != nil && n.fid != "" {
				s.meta.add(n.fid, ch)
			}
			walk(ch)
		}
	}
	walk(s.tree.EmbeddedInode())
}

// dupFile is a descriptor of f's open file of this server's own.
func dupFile(f *os.File) (*os.File, error) {
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("dup of %s: %w", f.Name(), err)
	}
	return os.NewFile(uintptr(fd), f.Name()), nil
}
