package ipc

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/gdsfs/gdsfs/gpu"
	"github.com/gdsfs/gdsfs/internal/access"
	"github.com/gdsfs/gdsfs/internal/units"
	"github.com/gdsfs/gdsfs/proto"
	"github.com/gdsfs/gdsfs/staging"
)

// held is one file handed out on a connection: its staging lease, which
// ends when the connection closes. The server keeps no descriptor of it:
// each answer that grants it exports the region again (Region.Export:
// duplicates of the memfds, or of the descriptors a GPU region keeps
// from its first export), closed once the answer is sent (conn.answering),
// so what a peer holds costs the server none.
type held struct {
	lease *staging.Lease
	// gen: the generation the peer was granted it as (drop names it)
	gen uint64
	// key: its key in conn.held
	key gpu.Region
	// maps: full grants of it on the connection the peer has not dropped
	// (its mappings); held while this is above 0 or a lease names it
	maps    int
	bytes   int64 // device bytes of its chunks
	private bool  // the lease's own copy (ipc.sharing private)
	// fresh: the descriptors hold exported, for the grant of the request
	// that made it (nil once taken, or for a file held before)
	fresh []*os.File
}

func (cn *conn) acquire(req proto.Request) (proto.Response, []int) {
	g, fds, err := cn.grant(req.Path, req.Generation, cn.s.asked(req))
	if err != nil {
		return cn.fail(err), nil
	}
	r := cn.ok()
	r.Grant = g
	return r, fds
}

// acquireMany grants each path in turn; one file's error is its item's.
func (cn *conn) acquireMany(req proto.Request) (proto.Response, []int) {
	r := cn.ok()
	var fds []int
	a := cn.s.asked(req)
	for i, p := range req.Paths {
		var gen uint64
		if req.Generations != nil {
			gen = req.Generations[i]
		}
		g, f, err := cn.grant(p, gen, a)
		if cn.handedOff() {
			break // the whole request is handed over (cutShort)
		}
		if err != nil {
			code, msg := errnoOf(err)
			r.Files = append(r.Files, proto.Item{Errno: proto.ErrnoName(code), Error: msg})
			continue
		}
		r.Files = append(r.Files, proto.Item{OK: true, Grant: g})
		fds = append(fds, f...)
	}
	return r, fds
}

// asking is what an acquire or acquire_many asks of each file's grant.
type asking struct {
	// device is where the client runs ("": not said): staging places the
	// lease (staging.Request.Device).
	device string
	// roomWait bounds the waits for room (0: ipc.acquire_timeout alone).
	roomWait time.Duration
	// resident: a file not resident now is refused (ENODATA), not staged.
	resident bool
	// identity: the grant says which file it holds (Grant.Identity).
	identity bool
}

func (s *Server) asked(req proto.Request) asking {
	return asking{device: req.Device, roomWait: s.roomWait(req), resident: req.Resident, identity: req.Identity}
}

// grant leases one file for this connection. gen is the generation the
// client holds mapped from this connection (0: none): if it is still
// current the answer reuses it (no descriptors); if not, ESTALE.
func (cn *conn) grant(p string, gen uint64, a asking) (proto.Grant, []int, error) {
	s := cn.s
	rel, err := cn.rel(p)
	if err != nil {
		return proto.Grant{}, nil, err
	}
	if err := cn.leaseRoom(); err != nil {
		return proto.Grant{}, nil, err
	}
	h, reuse, err := cn.leaseHeld(rel, gen, a)
	if err != nil {
		return proto.Grant{}, nil, err
	}
	var files []*os.File
	if !reuse {
		// one export per region and answer: an item naming a file the
		// answer already carries sends the same descriptors again (the
		// kernel gives the peer its own each time)
		r := h.lease.Region()
		fresh := h.fresh
		h.fresh = nil
		if files = cn.answering[r]; files != nil {
			closeFiles(fresh)
		} else {
			if files = fresh; files == nil {
				if files, err = r.Export(); err != nil {
					return proto.Grant{}, nil, fmt.Errorf("export %s: %w", rel, err)
				}
			}
			if cn.answering == nil {
				cn.answering = map[gpu.Region][]*os.File{}
			}
			cn.answering[r] = files
		}
		h.maps++ // exported: one more mapping of the peer's
		cn.mapped = append(cn.mapped, h)
	}
	id := s.nextLease.Add(1)
	cn.leases[id] = h
	cn.grants = append(cn.grants, id)
	s.mu.Lock()
	s.useLocked(cn.cred.UID, func(u *use) { u.leases++ })
	keep := s.heldRoomToKeepLocked(cn.cred.UID)
	s.mu.Unlock()
	g := proto.Grant{
		Lease: id, Size: h.lease.Size(), Generation: h.lease.Generation(), Device: h.lease.Device(),
		Sharing: s.cfg.Options.Sharing, Cache: keep && s.cacheable(), Reuse: reuse,
	}
	if a.identity {
		g.Identity = s.identity(h.lease)
	}
	s.log.Debug("lease", zap.String("path", rel), zap.Uint64("lease", id), zap.Uint32("uid", cn.cred.UID), zap.Bool("reuse", reuse))
	if reuse {
		return g, nil, nil
	}
	for _, n := range h.lease.Chunks() {
		g.Chunks = append(g.Chunks, proto.Chunk{Len: n})
	}
	fds := make([]int, len(files))
	for i, f := range files {
		fds[i] = int(f.Fd())
	}
	return g, fds, nil
}

// identity is the file l holds as the mount shows it, or nil where the
// mount has not given its inode a number (Config.NodeID).
func (s *Server) identity(l *staging.Lease) *proto.FileIdentity {
	if s.cfg.NodeID == nil {
		return nil
	}
	dev, ino := l.Inode()
	id, ok := s.cfg.NodeID(dev, ino)
	if !ok {
		return nil
	}
	mtime, ctime := l.Times()
	return &proto.FileIdentity{Ino: id, Size: l.Size(), MtimeNS: mtime, CtimeNS: ctime}
}

// leaseHeld stages rel for the peer and holds it on this connection.
// Everything is bounded by ipc.acquire_timeout: the wait for room on the
// device (staging) and the wait for room under the uid's
// ipc.max_held_per_uid, during which the lease is given back (waitHeld).
// a.roomWait (0: none) bounds each of those two waits for room further.
// a.resident: a file the peer may read that is not resident is refused
// (ENODATA), and so is one the uid has no room for now (EDQUOT): such an
// acquire never waits.
func (cn *conn) leaseHeld(rel string, gen uint64, a asking) (*held, bool, error) {
	device, roomWait := a.device, a.roomWait
	s := cn.s
	start := time.Now()
	deadline := start.Add(s.cfg.Options.AcquireTimeout)
	var bound heldBound    // the wait for the uid's room, from its start
	var ticket *heldTicket // set while queued for the uid's room
	defer cn.leaveHeld(&ticket)
	for {
		f, err := cn.openAsPeer(rel)
		if err != nil {
			return nil, false, err
		}
		ctx, cancel := context.WithDeadline(cn.ctx, deadline)
		l, err := s.cfg.Cache.Acquire(ctx, staging.Request{
			Rel: rel, File: f, Private: s.cfg.Options.Sharing == SharingPrivate, Device: device, RoomWait: roomWait,
			Resident: a.resident,
		})
		cancel()
		f.Close()
		if err != nil {
			return nil, false, s.acquireErr(rel, err, time.Since(start), roomWait)
		}
		h := cn.held[l.Region()]
		switch {
		case gen != 0 && gen != l.Generation():
			l.Release()
			return nil, false, proto.Errorf(proto.ESTALE,
				"%s changed since generation %d (now %d): unmap it, drop it and acquire afresh", rel, gen, l.Generation())
		case h != nil:
			l.Release() // this connection already holds these bytes
			return h, gen != 0, nil
		}
		h, wake, err := cn.hold(rel, l, &ticket)
		if wake == nil {
			if err != nil {
				l.Release()
			}
			return h, false, err
		}
		l.Release() // nothing pinned while it waits
		if a.resident {
			return nil, false, proto.Errorf(proto.EDQUOT,
				"%s: the uid's leases hold ipc.max_held_per_uid (%s); a resident-only acquire does not wait for room",
				rel, units.HumanBytes(s.heldLimit))
		}
		if bound.by.IsZero() {
			bound = s.heldBound(start, deadline, roomWait)
		}
		if err := cn.waitHeld(rel, ticket, wake, bound); err != nil {
			return nil, false, err
		}
	}
}

// rel turns a request path into a SOURCE-relative one.
func (cn *conn) rel(p string) (string, error) {
	if rest, ok := strings.CutPrefix(p, cn.s.cfg.Mountpoint+"/"); ok && cn.s.cfg.Mountpoint != "" {
		p = rest
	}
	rel := path.Clean("/" + p)[1:]
	if rel == "" {
		return "", proto.Errorf(proto.EINVAL, "path %q: does not name a file under the mount", p)
	}
	return rel, nil
}

// openAsPeer opens rel as the peer, so the kernel decides whether it may
// read it (modes, ACLs, every directory on the way). FIFOs, devices and
// directories are refused at once, never opened blocking.
func (cn *conn) openAsPeer(rel string) (*os.File, error) {
	s := cn.s
	if cn.credErr != nil {
		s.denied.Add(1)
		return nil, proto.Errorf(proto.EACCES, "%s: peer credentials unknown (%v)", rel, cn.credErr)
	}
	f, _, err := s.root.OpenRegular(cn.cred, rel, 0, access.Beneath)
	switch {
	case err == nil:
		return f, nil
	case errors.Is(err, syscall.EACCES) || errors.Is(err, syscall.EPERM):
		s.denied.Add(1)
		return nil, proto.Errorf(proto.EACCES, "%s: uid %d may not read it (%v)", rel, cn.cred.UID, err)
	case errors.Is(err, syscall.EXDEV):
		s.denied.Add(1)
		return nil, proto.Errorf(proto.EACCES, "%s: resolves outside the mount's SOURCE (%v)", rel, err)
	case errors.Is(err, access.ErrNotRegular):
		return nil, proto.Errorf(proto.EINVAL, "%s: only regular files are leased: %v", rel, err)
	}
	return nil, fmt.Errorf("%s: %w", rel, err)
}

// leaseRoom checks ipc.max_leases_per_uid before a grant.
func (cn *conn) leaseRoom() error {
	s := cn.s
	max := s.cfg.Options.MaxLeasesPerUID
	s.mu.Lock()
	defer s.mu.Unlock()
	if u := s.uids[cn.cred.UID]; u != nil && u.leases >= max {
		s.refused.Add(1)
		return proto.Errorf(proto.EDQUOT, "uid %d holds ipc.max_leases_per_uid (%d) leases; release some", cn.cred.UID, max)
	}
	return nil
}

// hold records l as held by this connection: counted against the uid's
// ipc.max_held_per_uid, exported for the grant (held.fresh). Where the
// uid has no room for it yet, it returns the channel to wait on
// (heldRoomLocked), with the request queued in *ticket. One that cannot
// fit while this connection is open (the file, with what the connection holds, passes
// the limit) is refused at once.
func (cn *conn) hold(rel string, l *staging.Lease, ticket **heldTicket) (*held, <-chan struct{}, error) {
	s := cn.s
	h := &held{lease: l, gen: l.Generation(), private: s.cfg.Options.Sharing == SharingPrivate}
	for _, n := range l.Chunks() {
		h.bytes += n
	}
	var own int64 // held on this connection: no wait gives it back
	for _, o := range cn.held {
		own += o.bytes
	}
	if own+h.bytes > s.heldLimit {
		s.refused.Add(1)
		if own == 0 {
			return nil, nil, proto.Errorf(proto.EDQUOT, "%s: its %s pass ipc.max_held_per_uid (%s) alone: it can never be leased",
				rel, units.HumanBytes(h.bytes), units.HumanBytes(s.heldLimit))
		}
		return nil, nil, proto.Errorf(proto.EDQUOT, "%s: %s more on a connection holding %s passes ipc.max_held_per_uid (%s): it cannot fit while this connection is open; close leases (their connections) first",
			rel, units.HumanBytes(h.bytes), units.HumanBytes(own), units.HumanBytes(s.heldLimit))
	}
	s.mu.Lock()
	if wake := s.heldRoomLocked(cn.cred.UID, h.bytes, ticket); wake != nil {
		s.mu.Unlock()
		return nil, wake, nil
	}
	first := 0
	if len(cn.held) == 0 {
		first = 1
	}
	s.useLocked(cn.cred.UID, func(u *use) { u.bytes += h.bytes; u.files++; u.hold += first })
	s.mu.Unlock()
	files, err := l.Region().Export()
	if err != nil {
		s.mu.Lock()
		s.useLocked(cn.cred.UID, func(u *use) { u.bytes -= h.bytes; u.files--; u.hold -= first })
		s.mu.Unlock()
		return nil, nil, fmt.Errorf("export %s: %w", rel, err)
	}
	h.fresh = files
	h.key = l.Region()
	cn.held[h.key] = h
	cn.fresh = append(cn.fresh, l.Region())
	return h, nil, nil
}

// release ends a lease id. The bytes it named stay held (counted against
// the capacity) until the connection closes.
func (cn *conn) release(req proto.Request) proto.Response {
	if req.Epoch != 0 && req.Epoch != cn.s.epoch {
		return cn.fail(proto.Errorf(proto.ESTALE, "lease %d is from another daemon instance (epoch %d); it ended with it", req.Lease, req.Epoch))
	}
	h, ok := cn.leases[req.Lease]
	if !ok {
		return cn.fail(proto.Errorf(proto.EINVAL, "no lease %d on this connection", req.Lease))
	}
	delete(cn.leases, req.Lease)
	cn.s.mu.Lock()
	cn.s.useLocked(cn.cred.UID, func(u *use) { u.leases-- })
	cn.s.mu.Unlock()
	if h != unpinned && h.maps == 0 && cn.held[h.key] == h && !cn.named(h) {
		cn.letGo(h) // dropped while this lease was open
	}
	return cn.ok()
}

// named says whether a lease on the connection names h.
func (cn *conn) named(h *held) bool {
	for _, o := range cn.leases {
		if o == h {
			return true
		}
	}
	return false
}

// end gives back h's staging lease (evictable once no one else holds it)
// and closes the descriptors exported for a grant not yet taken. The
// caller takes h out of conn.held and uncounts its bytes.
func (h *held) end() {
	h.lease.Release()
	closeFiles(h.fresh)
	h.fresh = nil
}

// letGo stops holding h: no longer counted, and evictable.
func (cn *conn) letGo(h *held) {
	delete(cn.held, h.key)
	h.end()
	emptied := 0
	if len(cn.held) == 0 {
		emptied = 1
	}
	cn.s.mu.Lock()
	cn.s.useLocked(cn.cred.UID, func(u *use) {
		u.bytes -= h.bytes
		u.files--
		u.hold -= emptied
	})
	cn.s.mu.Unlock()
}

// drop says the peer unmapped one grant of a generation on a device that
// this connection holds: one of its mappings is gone. The bytes are let
// go (no longer counted against the capacity and the uid's limits, and
// evictable) once no grant of them is mapped and no lease on the
// connection names them, at once or at the release of the last such
// lease. Where several regions match (private copies of one file), one
// with a grant not dropped is taken, one no lease names first. A
// generation the connection does not hold is EINVAL.
func (cn *conn) drop(req proto.Request) proto.Response {
	var pick *held
	rank := func(h *held) int {
		switch {
		case h.maps > 0 && !cn.named(h):
			return 2
		case h.maps > 0:
			return 1
		}
		return 0
	}
	for _, h := range cn.held {
		if h.gen != req.Generation || h.lease.Device() != req.Device {
			continue
		}
		if pick == nil || rank(h) > rank(pick) {
			pick = h
		}
	}
	if pick == nil {
		return cn.fail(proto.Errorf(proto.EINVAL, "this connection holds no generation %d on %s", req.Generation, req.Device))
	}
	if pick.maps > 0 {
		pick.maps--
	}
	if pick.maps == 0 && !cn.named(pick) {
		cn.letGo(pick)
	}
	return cn.ok()
}

func (cn *conn) stat(req proto.Request) proto.Response {
	rel, size, err := cn.readable(req.Path)
	if err != nil {
		return cn.fail(err)
	}
	state, loadPath := cn.s.cfg.Cache.Attr(rel)
	return cn.described(rel, size, state, loadPath)
}

// described is stat's (and wait's) answer for rel in state: with why
// for an absent file whose reason the cache knows.
func (cn *conn) described(rel string, size int64, state, loadPath string) proto.Response {
	r := cn.ok()
	r.State, r.LoadPath, r.Size = state, loadPath, size
	if state == proto.StateAbsent {
		r.Why = cn.s.cfg.Cache.AbsentReason(rel)
	}
	return r
}

// readable checks path as stat and wait do: opened as the peer (a peer
// that may not read it is refused), it returns its SOURCE-relative path
// and size.
func (cn *conn) readable(path string) (rel string, size int64, err error) {
	if rel, err = cn.rel(path); err != nil {
		return "", 0, err
	}
	f, err := cn.openAsPeer(rel)
	if err != nil {
		return "", 0, err
	}
	fi, err := f.Stat()
	f.Close()
	if err != nil {
		return "", 0, err
	}
	return rel, fi.Size(), nil
}

// roomWait is the bound req's room_wait_ms puts on its waits for room: 0
// (ipc.acquire_timeout alone) where it names none, or one not shorter
// than ipc.acquire_timeout.
func (s *Server) roomWait(req proto.Request) time.Duration {
	d := time.Duration(req.RoomWaitMS) * time.Millisecond
	if d >= s.cfg.Options.AcquireTimeout {
		return 0
	}
	return d
}

// acquireErr words a failed acquire: ENOSPC says how long it waited, of
// which bound (ipc.acquire_timeout, or the request's room_wait_ms when
// roomWait ran out), and what holds the capacity; a deadline while
// staging is ETIMEDOUT.
func (s *Server) acquireErr(rel string, err error, waited, roomWait time.Duration) error {
	var pe *proto.Error
	if errors.As(err, &pe) {
		return err
	}
	code := proto.ErrnoOf(err)
	switch {
	case code == proto.ENOSPC:
		st := s.Stats()
		of := fmt.Sprintf("ipc.acquire_timeout %s", s.cfg.Options.AcquireTimeout)
		if errors.Is(err, staging.ErrRoomWait) {
			of = fmt.Sprintf("the request's room_wait_ms %d", roomWait.Milliseconds())
		}
		return proto.Errorf(proto.ENOSPC, "%v (waited %s of %s; %s of the capacity is held by %d lease connections, which hold it until they close)",
			err, waited.Round(time.Millisecond), of, units.HumanBytes(st.HeldBytes), st.HoldingConnections)
	case errors.Is(err, context.DeadlineExceeded):
		return proto.Errorf(proto.ETIMEDOUT, "%s: not staged within ipc.acquire_timeout (%s): %v", rel, s.cfg.Options.AcquireTimeout, err)
	case errors.Is(err, context.Canceled):
		return proto.Errorf(proto.EIO, "%s: the daemon is stopping", rel)
	}
	return err
}

// errnoOf is the errno and message an error is answered with: a
// *proto.Error as it is; otherwise the errno it wraps (ENOENT for a
// missing file, EIO when it carries none).
func errnoOf(err error) (syscall.Errno, string) {
	var pe *proto.Error
	if errors.As(err, &pe) {
		return pe.Code, pe.Msg
	}
	var errno syscall.Errno
	switch {
	case errors.As(err, &errno) && errno != 0:
	case errors.Is(err, fs.ErrNotExist):
		errno = syscall.ENOENT
	default:
		errno = syscall.EIO
	}
	return errno, err.Error()
}
