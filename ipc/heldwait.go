package ipc

// Waiting for room under ipc.max_held_per_uid. A uid holding its limit
// over open connections is one client with many workers as often as not
// (16 DataLoader workers of one training job), so an acquire that would
// pass the limit waits, first come first served among that uid's
// requests, until the uid's connections close enough bytes; it fails with
// EDQUOT when ipc.acquire_timeout (or the request's shorter room_wait_ms)
// passes first, or at once when the file alone is larger than the limit.
// Other uids are not held up: each uid has its own queue.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gdsfs/gdsfs/internal/fifo"
	"github.com/gdsfs/gdsfs/internal/units"
	"github.com/gdsfs/gdsfs/proto"
)

// heldRoomToKeepLocked says whether the uid has room enough for a client
// to keep a released file mapped (the repeat-lease cache): nobody of the
// uid waits for room, and ipc.cache_headroom of its ipc.max_held_per_uid
// is still free. Kept mappings hold their bytes until the client drops
// them, which a client blocked in its own acquire does not do: without
// this, the workers of one uid could each keep a file and all wait for
// room that only their kept files hold. s.mu must be held.
func (s *Server) heldRoomToKeepLocked(uid uint32) bool {
	if q := s.heldQueue[uid]; q != nil && q.Len() > 0 {
		return false
	}
	var used int64
	if u := s.uids[uid]; u != nil {
		used = u.bytes
	}
	return s.heldLimit-used >= s.headroom
}

// heldTicket is one request's place in its uid's queue.
type heldTicket struct{ bytes int64 }

// heldLine is one uid's queue (internal/fifo).
type heldLine = fifo.Queue[*heldTicket]

// heldRoomLocked says whether uid may hold b more bytes now: within the
// limit, and first in the uid's queue or with nobody queued. If not, the
// request is queued (once: *t) and the channel closed at the next change
// of the counters or of the queue is returned. Given room, a queued
// request leaves the queue. s.mu must be held.
func (s *Server) heldRoomLocked(uid uint32, b int64, t **heldTicket) <-chan struct{} {
	if s.fitsHeldLocked(uid, b, *t) {
		s.leaveHeldLocked(uid, t)
		return nil
	}
	if *t == nil {
		*t = &heldTicket{bytes: b}
		q := s.heldQueue[uid]
		if q == nil {
			q = &heldLine{}
			s.heldQueue[uid] = q
		}
		q.Join(*t)
	}
	return s.changed
}

// fitsHeldLocked: b more bytes fit uid's limit and t (nil: a request not
// queued) is next. s.mu must be held.
func (s *Server) fitsHeldLocked(uid uint32, b int64, t *heldTicket) bool {
	if q := s.heldQueue[uid]; q != nil && !q.MayGo(t) {
		return false
	}
	var used int64
	if u := s.uids[uid]; u != nil {
		used = u.bytes
	}
	return used+b <= s.heldLimit
}

// leaveHeldLocked takes *t out of uid's queue, if queued, and wakes the
// others (the next may now go). s.mu must be held.
func (s *Server) leaveHeldLocked(uid uint32, t **heldTicket) {
	if *t == nil {
		return
	}
	if q := s.heldQueue[uid]; q != nil {
		q.Leave(*t)
		if q.Len() == 0 {
			delete(s.heldQueue, uid)
		}
	}
	*t = nil
	s.changedLocked()
}

// leaveHeld is leaveHeldLocked taking s.mu.
func (cn *conn) leaveHeld(t **heldTicket) {
	cn.s.mu.Lock()
	cn.s.leaveHeldLocked(cn.cred.UID, t)
	cn.s.mu.Unlock()
}

// heldBound is how long a request may wait for its uid's room: until by,
// which is when the bound named passes (ipc.acquire_timeout, or the
// request's room_wait_ms where that ends first); the wait began at start.
type heldBound struct {
	by    time.Time
	name  string
	start time.Time
}

// heldBound is the bound of a wait for the uid's room starting now, for
// an acquire that began at start, whose ipc.acquire_timeout passes at
// deadline and that bounds its waits for room by roomWait (0: none).
func (s *Server) heldBound(start, deadline time.Time, roomWait time.Duration) heldBound {
	now := time.Now()
	if roomWait > 0 && now.Add(roomWait).Before(deadline) {
		return heldBound{by: now.Add(roomWait), name: fmt.Sprintf("the request's room_wait_ms %d", roomWait.Milliseconds()), start: now}
	}
	return heldBound{by: deadline, name: fmt.Sprintf("ipc.acquire_timeout %s", s.cfg.Options.AcquireTimeout), start: start}
}

// waitHeld blocks, from wake on, until t is first in its uid's queue and
// its bytes fit, or b passes (EDQUOT), or the peer or the server goes.
// The caller then acquires again: the lease it had was released while it
// waited, so the wait pins no capacity.
func (cn *conn) waitHeld(rel string, t *heldTicket, wake <-chan struct{}, b heldBound) error {
	s := cn.s
	ms := time.Until(b.by).Milliseconds()
	if ms < 1 {
		return cn.heldTimeout(rel, t, b)
	}
	ctx, done := cn.waitContext(ms)
	defer done()
	for {
		if err := cn.block(ctx, wake); err != nil {
			if errors.Is(err, context.DeadlineExceeded) && s.ctx.Err() == nil {
				return cn.heldTimeout(rel, t, b)
			}
			return cn.waitErr(err, "%s: waiting for room under ipc.max_held_per_uid", rel)
		}
		s.mu.Lock()
		fits := s.fitsHeldLocked(cn.cred.UID, t.bytes, t)
		wake = s.changed
		s.mu.Unlock()
		if fits {
			return nil
		}
	}
}

// heldTimeout is the EDQUOT of a request that waited out its bound for
// its uid's held bytes to be dropped or their connections to close.
func (cn *conn) heldTimeout(rel string, t *heldTicket, b heldBound) error {
	s := cn.s
	s.refused.Add(1)
	s.mu.Lock()
	var used int64
	if u := s.uids[cn.cred.UID]; u != nil {
		used = u.bytes
	}
	s.mu.Unlock()
	return proto.Errorf(proto.EDQUOT, "%s: uid %d holds %s over open connections; %s more passes ipc.max_held_per_uid (%s); waited %s (%s) for its held bytes to be dropped or their connections to close",
		rel, cn.cred.UID, units.HumanBytes(used), units.HumanBytes(t.bytes), units.HumanBytes(s.heldLimit),
		time.Since(b.start).Round(time.Millisecond), b.name)
}
