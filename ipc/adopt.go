package ipc

// The successor's side of a hand-over (handover.go): Adopt.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/gpu"
	"github.com/gdsfs/gdsfs/internal/access"
	"github.com/gdsfs/gdsfs/proto"
	"github.com/gdsfs/gdsfs/staging"
)

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
	if uc.Uid != cs.UID || uc.Gid != cs.GID {
		return fmt.Errorf("descriptor %d's peer is uid %d gid %d, not uid %d gid %d as handed over",
			cs.FD, uc.Uid, uc.Gid, cs.UID, cs.GID)
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
	maps := 1 // a state without Maps (an older daemon's): the peer maps it once
	if hs.Maps != nil {
		maps = max(*hs.Maps, 0)
	}
	h := &held{lease: l, gen: hs.Generation, maps: maps, bytes: hs.Bytes, private: hs.Private}
	h.key = l.Region()
	if hs.Private || cn.held[h.key] != nil {
		h.key = &adoptedCopy{l.Region()} // no acquire reuses it
	}
	cn.held[h.key] = h
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
