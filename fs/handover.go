package fs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// FUSEStateVersion is the version of FUSEState this package writes and
// reads.
//
// Version 2: a predecessor that let go (Abandon) may leave requests it
// read unanswered, for the successor to have the kernel resend them
// (kernelrefs.go); a reader of version 1 would leave their callers
// waiting, so it refuses version 2. Version 1's predecessor answered
// them itself: Adopt reads it too.
const FUSEStateVersion = 2

// FUSEState is what a successor daemon needs to keep answering the
// kernel on the mount's FUSE connection (/dev/fuse): the connection
// itself, the kernel's INIT, every node id the kernel holds with its
// lookup count and where it is in the tree, and every open file handle
// with its backing descriptor. Descriptors are indexes into the files
// returned beside it.
type FUSEState struct {
	Version    int
	Source     string
	SourceDev  uint64 // SOURCE's directory, as the predecessor opened it
	SourceIno  uint64
	Mountpoint string
	MountDev   uint64
	FUSE       int // the connection
	Kernel     KernelInit
	// The options the connection was set up with; a successor must use
	// the same.
	MaxRead     int64
	Passthrough string
	AllowOther  bool
	MountFlags  []string

	Nodes       []NodeState // parents before children
	Handles     []HandleState
	Foreign     []foreignID // node ids of files not on SOURCE's filesystem (nodeids.go)
	ForeignNext uint64
	// Died: the predecessor died (this is its ConnectionState): its
	// tables died with it, and it may have died with requests read and
	// not answered.
	Died bool `json:"Resend,omitempty"`
	// Journal: the index among the files of the predecessor's node
	// journal (journal.go), whose nodes a successor after its death
	// adopts; 0: none.
	Journal int `json:",omitempty"`

	deadHandles uint64 // handle numbers up to it a dead predecessor may have handed out (its journal's)
}

// KernelInit is the kernel's INIT request of the connection.
type KernelInit struct {
	Major, Minor, MaxReadAhead, Flags, Flags2 uint32
}

// NodeState is one node of the tree: one the kernel holds (Lookups > 0)
// or a directory on the way to one.
type NodeState struct {
	ID      uint64 // node id
	Parent  uint64 // 1: the root; 0: in no directory (unlinked while open)
	Name    string
	Mode    uint32 // file type bits
	Dev     uint64
	Ino     uint64
	Gen     uint64
	Lookups uint64 // the kernel's lookup count
	FID     string `json:",omitempty"` // what change events name the file by (meta.go)
	Kept    int    // the file kept after an unlink through the mount (replaced.go), -1: none
	// The file's version at the last open (open.go).
	Size, Mtime, Ctime int64
}

// HandleState is one file handle the kernel holds.
type HandleState struct {
	Fh                         uint64
	Node                       uint64
	Dir                        bool
	File                       int // the open backing file or directory
	Charged                    bool
	UID                        uint32 // whose fuse.max_open_per_uid it counts against, when Charged
	Rel                        string
	Writable, Reading, Written bool
	// BackingID is the passthrough backing id the kernel's file reads
	// through (0: none); it stays registered on the connection.
	BackingID int32
}

// handoffTimeout bounds the wait for the requests in flight.
const handoffTimeout = 10 * time.Second

// handover is an old server's side of a hand-over in progress.
type handover struct {
	conn int           // a descriptor of the connection
	spA  int           // the socket end s.fuseFd names now
	spB  int           // its peer, read by forward
	dir  int           // "/", which Abandon points s.fuseFd at
	hold bool          // requests read in the instant of the switch wait (kernelrefs.go)
	done chan struct{} // forward returned
}

// Handoff stops serving at a point where no request is half answered
// (the kernel's requests queue in the connection) and returns what a
// successor needs. The returned files are dups the caller closes.
func (s *Server) Handoff() (FUSEState, []*os.File, error) {
	s.hoMu.Lock()
	defer s.hoMu.Unlock()
	if s.ho != nil {
		return FUSEState{}, nil, errors.New("fuse hand-over: one is already in progress")
	}
	if s.fuseFd < 0 {
		return FUSEState{}, nil, errors.New("fuse hand-over: the mount's FUSE descriptor is not known")
	}
	if s.pending != nil {
		return FUSEState{}, nil, errors.New("fuse hand-over: this server does not serve the connection yet")
	}
	s.meta.pause()
	ho, err := s.detach()
	if err != nil {
		s.meta.unpause()
		return FUSEState{}, nil, fmt.Errorf("fuse hand-over: %w", err)
	}
	if err := s.raw.refs.stop(handoffTimeout, ho.hold); err != nil {
		s.reattach(ho)
		s.meta.unpause()
		return FUSEState{}, nil, fmt.Errorf("fuse hand-over: %w", err)
	}
	st, files, err := s.state(ho)
	if err != nil {
		for _, f := range files {
			f.Close()
		}
		s.raw.refs.resume()
		s.reattach(ho)
		s.meta.unpause()
		return FUSEState{}, nil, fmt.Errorf("fuse hand-over: %w", err)
	}
	s.ho = ho
	return st, files, nil
}

// detach points go-fuse's descriptor at a socket, whose writes are
// forwarded to the connection, and wakes the readers blocked on it.
func (s *Server) detach() (*handover, error) {
	fdMu.Lock()
	defer fdMu.Unlock()
	conn, err := unix.FcntlInt(uintptr(s.fuseFd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("dup of the FUSE descriptor: %w", err)
	}
	dir, err := unix.Open("/", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		unix.Close(conn)
		return nil, fmt.Errorf("opening /: %w", err)
	}
	sp, err := seqpacket()
	if err != nil {
		unix.Close(conn)
		unix.Close(dir)
		return nil, err
	}
	ho := &handover{conn: conn, spA: sp[0], spB: sp[1], dir: dir, hold: canResend(s.kernelInit()), done: make(chan struct{})}
	go forward(ho.spB, conn, ho.done)
	if err := unix.Dup3(ho.spA, s.fuseFd, unix.O_CLOEXEC); err != nil {
		ho.close()
		return nil, fmt.Errorf("dup3: %w", err)
	}
	if err := kickReaders(s.fuseFd, "fuse_dev_do_read"); err != nil {
		s.reattach(ho)
		return nil, err
	}
	return ho, nil
}

// reattach points go-fuse's descriptor at the connection again.
func (s *Server) reattach(ho *handover) error {
	err := unix.Dup3(ho.conn, s.fuseFd, unix.O_CLOEXEC)
	if err == nil {
		err = kickReaders(s.fuseFd, socketWait)
	}
	ho.close()
	return err
}

// close stops forward and closes the hand-over's descriptors.
func (ho *handover) close() {
	unix.Write(ho.spA, nil) // an empty message: forward returns
	<-ho.done
	unix.Close(ho.spA)
	unix.Close(ho.spB)
	unix.Close(ho.conn)
	unix.Close(ho.dir)
}

// Resume undoes Handoff: this server serves the connection again.
func (s *Server) Resume() error {
	s.hoMu.Lock()
	defer s.hoMu.Unlock()
	if s.ho == nil {
		return errors.New("fuse resume: no hand-over in progress")
	}
	ho := s.ho
	s.ho = nil
	err := s.reattach(ho)
	s.raw.refs.resume()
	s.meta.unpause()
	if err != nil {
		return fmt.Errorf("fuse resume: %w", err)
	}
	return nil
}

// Abandon ends this server after its successor took over, or an
// adopted server that never served (Adopt without Serve): the mount
// stays, and so does everything the kernel holds; the server's readers
// stop, and it closes its own descriptors.
func (s *Server) Abandon() {
	s.hoMu.Lock()
	ho := s.ho
	s.ho = nil
	if ho == nil && s.pending != nil {
		s.releaseUnserved()
		s.hoMu.Unlock()
		s.letSourceGo()
		return
	}
	s.hoMu.Unlock()
	if ho == nil {
		s.log.Warn("fuse abandon without a hand-over: ignored")
		return
	}
	// go-fuse's readers stop at a read error: a directory gives EISDIR
	// (and a closed socket end-of-file, which go-fuse logs as a short
	// read). Its writes fail there too: where the kernel resends, the
	// requests held back in enter fail unanswered, for the successor to
	// have resent; elsewhere they are failed before, through the socket.
	if !ho.hold {
		s.raw.refs.abandon()
	}
	unix.Dup3(ho.dir, s.fuseFd, unix.O_CLOEXEC)
	kickReaders(s.fuseFd, "")
	if ho.hold {
		s.raw.refs.abandon()
	}
	unix.Write(ho.spA, nil)
	<-ho.done
	unix.Close(ho.spB)
	unix.Close(ho.spA)
	<-s.served
	unix.Close(ho.conn)
	unix.Close(ho.dir)
	s.releaseHandles()
	s.letSourceGo()
}

// releaseHandles closes this server's descriptors of the open handles,
// leaving their backing ids registered: the kernel's files read on
// through them.
func (s *Server) releaseHandles() {
	_, fhs := s.raw.refs.snapshot()
	for _, r := range fhs {
		switch h := r.h.(type) {
		case *file:
			h.LoopbackFile.Release(context.Background())
			h.charge.release()
		case *dirHandle:
			h.dirStream.Releasedir(context.Background(), 0)
			h.charge.release()
		}
	}
}

// ConnectionState is the part of the FUSEState that does not change
// while the mount serves: the connection and how it was set up, with no
// node and no handle. A successor that adopts it (after this daemon died:
// kept in the service manager's fd store) serves the connection with
// the nodes of this daemon's node journal (journal.go), found again: the
// kernel's node ids are the same for it (nodeids.go); an id it neither
// was given nor found answers ESTALE and the kernel looks the path up
// again; handles open before answer EBADF. The returned files (the
// connection, the journal's memfd) are dups the caller closes.
func (s *Server) ConnectionState() (FUSEState, []*os.File, error) {
	if s.fuseFd < 0 {
		return FUSEState{}, nil, errors.New("fuse connection state: the mount's FUSE descriptor is not known")
	}
	st := s.setup()
	d, err := unix.FcntlInt(uintptr(s.fuseFd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return FUSEState{}, nil, fmt.Errorf("fuse connection state: dup: %w", err)
	}
	st.Died = true
	files := []*os.File{os.NewFile(uintptr(d), "/dev/fuse")}
	s.meta.nodesMu.Lock()
	defer s.meta.nodesMu.Unlock()
	if j := s.meta.journal; j != nil {
		jd, err := unix.FcntlInt(j.f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			files[0].Close()
			return FUSEState{}, nil, fmt.Errorf("fuse connection state: dup of the node journal: %w", err)
		}
		st.Journal = len(files)
		files = append(files, os.NewFile(uintptr(jd), "gdsfs-nodes"))
	}
	return st, files, nil
}

// kernelInit is the kernel's INIT request of the connection.
func (s *Server) kernelInit() KernelInit {
	ki := s.fuse.KernelSettings()
	return KernelInit{Major: ki.Major, Minor: ki.Minor, MaxReadAhead: ki.MaxReadAhead, Flags: ki.Flags, Flags2: ki.Flags2}
}

// setup is the FUSEState without tables; FUSE is index 0.
func (s *Server) setup() FUSEState {
	var srcSt unix.Stat_t
	s.root.At(func(dirfd int) error { return unix.Fstat(dirfd, &srcSt) })
	return FUSEState{
		Version: FUSEStateVersion, Source: s.source, SourceDev: srcSt.Dev, SourceIno: srcSt.Ino,
		Mountpoint: s.mountpoint, MountDev: s.mountDev.Load(),
		Kernel:  s.kernelInit(),
		MaxRead: int64(s.opts.MaxRead), Passthrough: s.opts.Passthrough, AllowOther: s.opts.AllowOther, MountFlags: s.opts.MountFlags,
	}
}

// state collects the FUSEState while no request runs.
func (s *Server) state(ho *handover) (FUSEState, []*os.File, error) {
	st := s.setup()
	st.Foreign, st.ForeignNext = s.ids.snapshot()
	var files []*os.File
	add := func(fd int, name string) (int, error) {
		d, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			return -1, fmt.Errorf("dup of %s: %w", name, err)
		}
		files = append(files, os.NewFile(uintptr(d), name))
		return len(files) - 1, nil
	}
	var err error
	if st.FUSE, err = add(ho.conn, "/dev/fuse"); err != nil {
		return st, files, err
	}
	lookups, fhs := s.raw.refs.snapshot()
	seen := map[uint64]bool{fuse.FUSE_ROOT_ID: true}
	record := func(parent uint64, name string, in *gofs.Inode) error {
		id := in.StableAttr().Ino
		if seen[id] {
			return nil
		}
		seen[id] = true
		ns := NodeState{ID: id, Parent: parent, Name: name, Mode: in.StableAttr().Mode, Gen: in.StableAttr().Gen,
			Lookups: lookups[id], Kept: -1}
		if n := asNode(in.Operations()); n != nil {
			ns.Dev, ns.Ino, ns.FID = n.id.dev, n.id.ino, string(n.fid)
			n.mu.Lock()
			ns.Size, ns.Mtime, ns.Ctime = n.seen.size, n.seen.mtime.Nano(), n.seen.ctime.Nano()
			kept := n.kept
			n.mu.Unlock()
			if kept != nil {
				var err error
				if ns.Kept, err = add(int(kept.Fd()), kept.Name()); err != nil {
					return err
				}
			}
		}
		st.Nodes = append(st.Nodes, ns)
		return nil
	}
	var walk func(parent uint64, dir *gofs.Inode) error
	walk = func(parent uint64, dir *gofs.Inode) error {
		kids := dir.Children()
		names := make([]string, 0, len(kids))
		for name := range kids {
			names = append(names, name)
		}
		sort.Strings(names)
		for _, name := range names {
			ch := kids[name]
			id := ch.StableAttr().Ino
			if seen[id] {
				continue
			}
			if err := record(parent, name, ch); err != nil {
				return err
			}
			if err := walk(id, ch); err != nil {
				return err
			}
		}
		return nil
	}
	if err := walk(fuse.FUSE_ROOT_ID, s.tree.EmbeddedInode()); err != nil {
		return st, files, err
	}
	fhList := make([]uint64, 0, len(fhs))
	for fh := range fhs {
		fhList = append(fhList, fh)
	}
	sort.Slice(fhList, func(i, j int) bool { return fhList[i] < fhList[j] })
	for _, fh := range fhList {
		r := fhs[fh]
		hs := HandleState{Fh: fh, Node: r.node, BackingID: r.backing}
		var fd int
		var ch *charge
		switch h := r.h.(type) {
		case *file:
			fd, ch = h.fd(), h.charge
			hs.Rel, hs.Writable, hs.Reading, hs.Written = h.rel, h.writable, h.reading, h.written
			if err := record(0, "", h.node.EmbeddedInode()); err != nil {
				return st, files, err
			}
		case *dirHandle:
			fd, ch, hs.Dir = h.fd, h.charge, true
		default:
			s.log.Info("fuse hand-over: a handle of a control file is not handed over", zap.Uint64("fh", fh))
			continue
		}
		if ch != nil {
			hs.Charged, hs.UID = true, ch.uid
		}
		if hs.File, err = add(fd, hs.Rel); err != nil {
			return st, files, err
		}
		st.Handles = append(st.Handles, hs)
	}
	return st, files, nil
}
