package ipc

// Handing the lease server to a successor daemon: the listening socket,
// every open connection with who is on it, the leases it holds and the
// bytes read from it but not handled, the epoch, the next lease id and
// the counters. Consumers see nothing but a pause: their connections,
// lease ids and mappings stay valid.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"syscall"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/gpu"
	"github.com/gdsfs/gdsfs/internal/access"
	"github.com/gdsfs/gdsfs/proto"
	"github.com/gdsfs/gdsfs/staging"
)

// StateVersion is the version of IPCState this package writes and reads.
const StateVersion = 1

// IPCState is what a successor's Adopt needs. Descriptors are named by
// their index in the files handed over beside it.
type IPCState struct {
	Version   int
	Socket    string // the listening socket's path
	Listener  int    // its descriptor
	Epoch     uint64
	NextLease uint64 // the last lease id granted
	Counters  Counters
	Conns     []ConnState
}

// Counters are the server's counters that continue in the successor.
type Counters struct {
	Connections, Requests, BadRequests, AcceptErrors uint64
	Timeouts, Refused, LeaseDenied                   uint64
	// Fallbacks reported, in all and per reason; the reasons each uid
	// named first (their bound).
	Fallbacks       uint64
	FallbackReasons map[string]uint64
	ReasonsNamedBy  map[uint32]int
}

// ConnState is one open connection.
type ConnState struct {
	FD int // its descriptor
	// The peer as checked at accept: SO_PEERCRED's ids, the groups and
	// capabilities read then. PID is SO_PEERCRED's, which Adopt checks
	// against the descriptor with the ids. CredErr: why they are unknown.
	UID, GID uint32
	PID      int32
	Groups   []uint32
	Caps     uint64
	CredErr  string
	// Pending: bytes read from the socket and not handled (part of a
	// request line, or whole lines).
	Pending []byte
	Held    []HeldState
	// Unpinned: lease ids not released whose file is no longer held
	// (dropped by an earlier hand-over); releasing them is all they do.
	Unpinned []uint64
}

// HeldState is one file held on a connection and the lease ids granted
// on it that are not released.
type HeldState struct {
	Path       string // relative to SOURCE
	Dev, Ino   uint64
	Size       int64
	Generation uint64
	Device     string
	Private    bool  // a copy of its own (ipc.sharing private)
	Bytes      int64 // counted against the uid's ipc.max_held_per_uid
	Leases     []uint64
}

// unpinned is the file of a lease id whose file is no longer held.
var unpinned = &held{}

// adoptedCopy keys a held file that no later acquire may reuse: a
// private copy, or a second hold of one region (Adopt).
type adoptedCopy struct{ gpu.Region }

// Handoff stops the server between requests (pause.go) and returns what
// a successor needs, with dups of the listening socket and of every
// connection (the caller closes them). The server keeps all it holds
// until Abandon or Resume; consumers' requests wait meanwhile.
func (s *Server) Handoff() (IPCState, []*os.File, error) {
	s.mu.Lock()
	switch {
	case s.closed:
		s.mu.Unlock()
		return IPCState{}, nil, errors.New("ipc: hand-over: the server is closed")
	case s.paused:
		s.mu.Unlock()
		return IPCState{}, nil, errors.New("ipc: hand-over: already handed off")
	}
	s.paused = true
	s.resumed = make(chan struct{})
	s.reqCancel(errHandedOff)
	past := time.Unix(1, 0)
	s.uln.SetDeadline(past)
	for cn := range s.active {
		cn.c.SetReadDeadline(past)
	}
	for s.busy > 0 {
		s.idle.Wait()
	}
	st, files, err := s.stateLocked()
	s.mu.Unlock()
	if err != nil {
		s.Resume()
		return IPCState{}, nil, fmt.Errorf("ipc: hand-over: %w", err)
	}
	return st, files, nil
}

// stateLocked is the state of a server handed off, nothing running.
// s.mu must be held.
func (s *Server) stateLocked() (IPCState, []*os.File, error) {
	st := IPCState{Version: StateVersion, Socket: s.path, Epoch: s.epoch, NextLease: s.nextLease.Load()}
	st.Counters = Counters{
		Connections: s.conns.Load(), Requests: s.requests.Load(), BadRequests: s.bad.Load(),
		AcceptErrors: s.acceptErrs.Load(), Timeouts: s.timeouts.Load(), Refused: s.refused.Load(),
		LeaseDenied: s.denied.Load(),
	}
	st.Counters.Fallbacks, st.Counters.FallbackReasons, st.Counters.ReasonsNamedBy = s.reports.state()
	var files []*os.File
	fail := func(err error) (IPCState, []*os.File, error) {
		for _, f := range files {
			f.Close()
		}
		return IPCState{}, nil, err
	}
	lf, err := s.uln.File()
	if err != nil {
		return fail(fmt.Errorf("listening socket: %w", err))
	}
	files = append(files, lf)
	for cn := range s.active {
		f, err := cn.c.File()
		if err != nil {
			return fail(fmt.Errorf("connection of uid %d: %w", cn.cred.UID, err))
		}
		files = append(files, f)
		cs := cn.state(len(files) - 1)
		if cn.credErr == nil {
			uc, err := ucred(cn.c)
			if err != nil {
				return fail(fmt.Errorf("connection of uid %d: %w", cn.cred.UID, err))
			}
			cs.PID = uc.Pid
		}
		st.Conns = append(st.Conns, cs)
	}
	return st, files, nil
}

// state is a parked connection's state, its descriptor at index fd.
func (cn *conn) state(fd int) ConnState {
	cs := ConnState{
		FD: fd, UID: cn.cred.UID, GID: cn.cred.GID, Groups: cn.cred.Groups, Caps: cn.cred.Caps,
		Pending: slices.Clone(cn.buf),
	}
	if cn.credErr != nil {
		cs.CredErr = cn.credErr.Error()
	}
	ids := map[*held][]uint64{}
	for id, h := range cn.leases {
		if h == unpinned {
			cs.Unpinned = append(cs.Unpinned, id)
			continue
		}
		ids[h] = append(ids[h], id)
	}
	for _, h := range cn.held {
		dev, ino := h.lease.Inode()
		cs.Held = append(cs.Held, HeldState{
			Path: h.lease.Path(), Dev: dev, Ino: ino, Size: h.lease.Size(), Generation: h.lease.Generation(),
			Device: h.lease.Device(), Private: h.private, Bytes: h.bytes, Leases: ids[h],
		})
	}
	return cs
}

// Resume undoes Handoff: the server serves again as before, and the
// requests cut short are answered from the start.
func (s *Server) Resume() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.paused || s.closed {
		return errors.New("ipc: resume: the server is not handed off")
	}
	s.paused = false
	s.nonblockLocked()
	s.reqCtx, s.reqCancel = context.WithCancelCause(s.ctx)
	s.wakeParkedLocked()
	return nil
}

// Abandon ends a server handed off to a successor that took it: its
// goroutines end and its descriptors close, but the socket's path stays,
// no lease ends and no connection is shut down (the successor serves
// them). On a server not handed off it is Close.
func (s *Server) Abandon() {
	s.mu.Lock()
	if !s.paused || s.closed {
		s.mu.Unlock()
		s.log.Warn("abandon without a hand-over: closing")
		s.Close()
		return
	}
	s.abandoned, s.closed = true, true
	s.cancel()
	s.wakeParkedLocked()
	s.uln.SetUnlinkOnClose(false)
	unserved := s.adopted
	s.adopted = nil
	s.mu.Unlock()
	s.ln.Close()
	for _, cn := range unserved {
		cn.c.Close()
	}
	s.wg.Wait()
	s.expMu.Lock()
	for r, e := range s.exports {
		for _, f := range e.files {
			f.Close()
		}
		delete(s.exports, r)
	}
	s.expMu.Unlock()
	s.root.Close()
}

// Adopt is Listen on a predecessor's socket and connections (Handoff's
// state and files; it dups what it keeps, the caller closes files). It
// serves nothing until Serve, which the caller calls once the
// predecessor can no longer resume: until then Close undoes it without
// touching the socket's path. The epoch, lease ids and counters continue.
// Each held file is leased again from cfg.Cache (resident there, the same
// file on the same device), so it stays pinned; one that is not is
// dropped with a log line: its lease ids stay valid, its bytes are no
// longer counted, and the consumer's mapping is its own.
func Adopt(cfg Config, st IPCState, files []*os.File) (*Server, error) {
	if st.Version != StateVersion {
		return nil, fmt.Errorf("ipc: hand-over state version %d; this daemon reads version %d", st.Version, StateVersion)
	}
	s, err := newServer(cfg)
	if err != nil {
		return nil, err
	}
	ln, err := s.adoptListener(st, files)
	if err != nil {
		s.root.Close()
		return nil, err
	}
	s.setListener(ln, st.Epoch)
	s.nextLease.Store(st.NextLease)
	c := st.Counters
	s.conns.Store(c.Connections)
	s.requests.Store(c.Requests)
	s.bad.Store(c.BadRequests)
	s.acceptErrs.Store(c.AcceptErrors)
	s.timeouts.Store(c.Timeouts)
	s.refused.Store(c.Refused)
	s.denied.Store(c.LeaseDenied)
	s.reports.restore(c.Fallbacks, c.FallbackReasons, c.ReasonsNamedBy)
	for _, cs := range st.Conns {
		s.adoptConn(cs, files)
	}
	return s, nil
}

// adoptListener is the predecessor's listening socket, or where this
// server's ipc.socket names another path, a new one there (the
// predecessor's is closed: clients find the new path in the mount).
func (s *Server) adoptListener(st IPCState, files []*os.File) (*net.UnixListener, error) {
	if st.Listener < 0 || st.Listener >= len(files) {
		return nil, fmt.Errorf("ipc: hand-over: listener descriptor %d of %d", st.Listener, len(files))
	}
	l, err := net.FileListener(files[st.Listener])
	if err != nil {
		return nil, fmt.Errorf("ipc: hand-over: listener: %w", err)
	}
	ln, ok := l.(*net.UnixListener)
	if !ok || ln.Addr().String() != st.Socket {
		l.Close()
		return nil, fmt.Errorf("ipc: hand-over: listener descriptor %d is %s %s, not the Unix socket %s",
			st.Listener, l.Addr().Network(), l.Addr(), st.Socket)
	}
	if st.Socket == s.path {
		s.unlinkAtServe = true
		return ln, nil
	}
	ln.Close()
	s.log.Warn("ipc.socket differs from the predecessor's: listening there; connections waiting on the old socket are reset",
		zap.String("socket", s.path), zap.String("predecessor", st.Socket))
	nl, err := listen(s.path)
	if err != nil {
		return nil, fmt.Errorf("ipc.socket %s: %w", s.path, err)
	}
	return nl, nil
}

// adoptConn takes over one connection, or drops it with a log line.
func (s *Server) adoptConn(cs ConnState, files []*os.File) {
	log := s.log.With(zap.Uint32("uid", cs.UID), zap.Int32("pid", cs.PID))
	if cs.FD < 0 || cs.FD >= len(files) {
		log.Warn("connection not adopted: no such descriptor", zap.Int("fd", cs.FD), zap.Int("files", len(files)))
		return
	}
	nc, err := net.FileConn(files[cs.FD])
	if err != nil {
		log.Warn("connection not adopted", zap.Error(err))
		return
	}
	c, ok := nc.(*net.UnixConn)
	if !ok {
		nc.Close()
		log.Warn("connection not adopted: not a Unix socket", zap.String("network", nc.LocalAddr().Network()))
		return
	}
	cn := &conn{s: s, c: c, held: map[gpu.Region]*held{}, leases: map[uint64]*held{},
		cred: access.Cred{UID: cs.UID, GID: cs.GID, Groups: cs.Groups, Caps: cs.Caps}}
	if cs.CredErr != "" {
		cn.credErr = errors.New(cs.CredErr)
	} else if err := samePeer(c, cs); err != nil {
		c.Close()
		log.Warn("connection not adopted", zap.Error(err))
		return
	}
	if len(cs.Pending) > 0 {
		cn.buf, cn.lineStart = slices.Clone(cs.Pending), time.Now()
	}
	var bytes int64
	for _, hs := range cs.Held {
		h := cn.adoptHeld(hs)
		for _, id := range hs.Leases {
			cn.leases[id] = h
		}
		bytes += h.bytes
	}
	for _, id := range cs.Unpinned {
		cn.leases[id] = unpinned
	}
	holding := 0
	if len(cn.held) > 0 {
		holding = 1
	}
	s.mu.Lock()
	s.useLocked(cn.cred.UID, func(u *use) {
		u.conns++
		u.leases += len(cn.leases)
		u.bytes += bytes
		u.files += len(cn.held)
		u.hold += holding
	})
	s.active[cn] = true
	s.adopted = append(s.adopted, cn)
	s.mu.Unlock()
}

// samePeer checks that c's SO_PEERCRED is the peer the state names.
func samePeer(c *net.UnixConn, cs ConnState) error {
	uc, err := ucred(c)
	if err != nil {
		return err
	}
	if uc.Uid != cs.UID || uc.Gid != cs.GID || uc.Pid != cs.PID {
		return fmt.Errorf("descriptor %d's peer is uid %d gid %d pid %d, not uid %d gid %d pid %d as handed over",
			cs.FD, uc.Uid, uc.Gid, uc.Pid, cs.UID, cs.GID, cs.PID)
	}
	return nil
}

// ucred is c's SO_PEERCRED: the peer's ids and pid at connect.
func ucred(c *net.UnixConn) (*unix.Ucred, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var uc *unix.Ucred
	if cerr := raw.Control(func(fd uintptr) { uc, err = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); cerr != nil {
		return nil, cerr
	}
	if err != nil {
		return nil, fmt.Errorf("SO_PEERCRED: %w", err)
	}
	return uc, nil
}

// nonblockLocked puts the listening socket and every connection back in
// non-blocking mode, which the server's deadlines need: a dup's Fd (to
// send it) puts the description it shares with ours in blocking mode.
// s.mu must be held.
func (s *Server) nonblockLocked() {
	set := func(c syscall.Conn) {
		if raw, err := c.SyscallConn(); err == nil {
			raw.Control(func(fd uintptr) { unix.SetNonblock(int(fd), true) })
		}
	}
	set(s.uln)
	for cn := range s.active {
		set(cn.c)
	}
}

// adoptHeld pins hs's file in this server's cache for the connection, or
// returns unpinned (logged) where it cannot.
func (cn *conn) adoptHeld(hs HeldState) *held {
	s := cn.s
	l, err := cn.repin(hs)
	if err != nil {
		s.log.Warn("held file not adopted: its bytes are no longer counted; the consumer's mapping stays valid",
			zap.String("path", hs.Path), zap.Uint32("uid", cn.cred.UID), zap.Uint64s("leases", hs.Leases), zap.Error(err))
		return unpinned
	}
	h := &held{lease: l, bytes: hs.Bytes, private: hs.Private}
	var key gpu.Region = l.Region()
	if hs.Private || cn.held[key] != nil {
		key = &adoptedCopy{l.Region()} // no acquire reuses it
	}
	cn.held[key] = h
	return h
}

// repin leases hs's file again: resident in the cache, the same file
// (device, inode, size) on the same device. A private copy is pinned by
// a shared lease: its bytes are the consumer's descriptors.
func (cn *conn) repin(hs HeldState) (*staging.Lease, error) {
	s := cn.s
	if state, _ := s.cfg.Cache.Attr(hs.Path); state != proto.StateResident {
		return nil, fmt.Errorf("%s in this daemon's cache, not %s", state, proto.StateResident)
	}
	if cn.credErr != nil {
		return nil, fmt.Errorf("peer credentials unknown (%v)", cn.credErr)
	}
	f, _, err := s.root.OpenRegular(cn.cred, hs.Path, 0, access.Beneath)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	ctx, cancel := context.WithTimeout(s.ctx, s.cfg.Options.AcquireTimeout)
	defer cancel()
	l, err := s.cfg.Cache.Acquire(ctx, staging.Request{Rel: hs.Path, File: f, Device: hs.Device})
	if err != nil {
		return nil, err
	}
	dev, ino := l.Inode()
	if dev != hs.Dev || ino != hs.Ino || l.Size() != hs.Size || l.Device() != hs.Device {
		l.Release()
		return nil, fmt.Errorf("now inode %d:%d, %d bytes on %s; was %d:%d, %d bytes on %s",
			dev, ino, l.Size(), l.Device(), hs.Dev, hs.Ino, hs.Size, hs.Device)
	}
	return l, nil
}
