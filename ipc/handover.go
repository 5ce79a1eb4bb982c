package ipc

// Handing the lease server to a successor daemon: the listening socket,
// every open connection with who is on it, the leases it holds and the
// bytes read from it but not handled, the epoch, the next lease id and
// the counters. Consumers see nothing but a pause: their connections,
// lease ids and mappings stay valid.

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"slices"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/gpu"
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
	// capabilities read then; Adopt checks the ids against the
	// descriptor's. PID is SO_PEERCRED's as this daemon sees it, for log
	// lines (a successor in another pid namespace sees another number).
	// CredErr: why the peer is unknown.
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
	// Maps: its grants the peer has not dropped (0 for a file dropped
	// while a lease names it); nil in an older daemon's state, which
	// did not count them: one
	Maps   *int
	Leases []uint64
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
		maps := h.maps
		cs.Held = append(cs.Held, HeldState{
			Path: h.lease.Path(), Dev: dev, Ino: ino, Size: h.lease.Size(), Generation: h.gen,
			Device: h.lease.Device(), Private: h.private, Bytes: h.bytes, Maps: &maps, Leases: ids[h],
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
	s.root.Close()
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

// CrashState is what a server restarted after this one died (SIGKILL,
// a crash) adopts from a store that outlived it (systemd's descriptor
// store): the listening socket (a dup, the caller closes it), with no
// connections (they end with the process), a new epoch (the leases
// granted on them are gone) and no counters (those of the moment it is
// taken would be stale by then). The server goes on serving.
func (s *Server) CrashState() (IPCState, []*os.File, error) {
	lf, err := s.uln.File()
	if err != nil {
		return IPCState{}, nil, fmt.Errorf("ipc: listening socket: %w", err)
	}
	var b [8]byte
	rand.Read(b[:])
	st := IPCState{Version: StateVersion, Socket: s.path, Epoch: binary.LittleEndian.Uint64(b[:]) | 1}
	return st, []*os.File{lf}, nil
}
