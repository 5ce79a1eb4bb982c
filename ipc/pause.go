package ipc

// Stopping the server for a hand-over (handover.go) at a point where
// nothing is half done. Handoff sets paused and cancels the request
// context; every goroutine that serves then parks (parkLocked) before it
// accepts, reads or answers anything more:
//   - the accept loop: its Accept is cut by a deadline in the past; new
//     connections wait in the listen backlog;
//   - a connection reading: its read is cut the same way; what it read is
//     kept (conn.buf) and handed over, and requests sent meanwhile wait in
//     the socket;
//   - a connection handling a request that may block (acquire,
//     acquire_many, wait, wait_stat): its waits end with the request
//     context, what it granted is undone and its line is put back in
//     front of the unread bytes (cutShort), so the successor (or this
//     server, resumed) answers it from the start; other requests finish
//     and are answered first.

import (
	"context"
	"errors"
	"time"

	"github.com/gdsfs/gdsfs/proto"
)

var (
	errHandedOff = errors.New("the server is handed over")
	errPaused    = errors.New("read stopped for a hand-over")
)

func (s *Server) isPaused() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.paused
}

// parkLocked waits, not counted as busy, while the server is handed off
// and neither resumed, abandoned nor closed. It says whether to go on
// serving (false: abandoned or closed). s.mu must be held; it is released
// while waiting.
func (s *Server) parkLocked() bool {
	if s.paused && !s.abandoned && !s.closed {
		s.busy--
		s.idle.Broadcast()
		for s.paused && !s.abandoned && !s.closed {
			ch := s.resumed
			s.mu.Unlock()
			<-ch
			s.mu.Lock()
		}
		s.busy++
	}
	return !s.abandoned && !s.closed
}

// wakeParkedLocked wakes the goroutines parked by a hand-over. s.mu must
// be held.
func (s *Server) wakeParkedLocked() {
	if s.resumed != nil {
		close(s.resumed)
		s.resumed = nil
	}
}

// accepting parks the accept loop while the server is handed off and
// says whether it goes on; then Accept blocks again.
func (s *Server) accepting() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.parkLocked() {
		return false
	}
	s.uln.SetDeadline(time.Time{})
	return true
}

// park parks the connection between requests while the server is handed
// off and says whether it goes on (false: it ends; cn.abandoned says
// whether without ending what it holds).
func (cn *conn) park() bool {
	s := cn.s
	s.mu.Lock()
	defer s.mu.Unlock()
	ok := s.parkLocked()
	cn.abandoned = s.abandoned
	return ok
}

// armRead sets the deadline of the next read, or says the server is
// handed off (errPaused): Handoff's deadline in the past is never
// overwritten.
func (cn *conn) armRead(deadline time.Time) error {
	s := cn.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.paused {
		return errPaused
	}
	cn.c.SetReadDeadline(deadline)
	return nil
}

// begin starts handling a request: its context, nothing granted yet.
func (cn *conn) begin() {
	cn.grants, cn.fresh, cn.mapped = cn.grants[:0], cn.fresh[:0], cn.mapped[:0]
	cn.s.mu.Lock()
	cn.ctx = cn.s.reqCtx
	cn.s.mu.Unlock()
}

// handedOff says whether a hand-over began while the request was handled.
func (cn *conn) handedOff() bool {
	return errors.Is(context.Cause(cn.ctx), errHandedOff)
}

// cutShort takes back a request that may block (acquire, acquire_many,
// wait, wait_stat) when a hand-over began while it was handled: what it
// granted is undone and its line goes back in front of the unread bytes,
// unanswered and not counted. It says whether it did.
func (cn *conn) cutShort(op string, line []byte) bool {
	switch op {
	case proto.OpAcquire, proto.OpAcquireMany, proto.OpWait, proto.OpWaitStat:
	default:
		return false
	}
	if !cn.handedOff() {
		return false
	}
	cn.rollback()
	cn.buf = append(append([]byte(nil), line...), cn.buf...)
	cn.lineStart = time.Now()
	cn.s.requests.Add(^uint64(0))
	return true
}

// rollback ends what the request being handled granted: its lease ids
// and the files it newly held.
func (cn *conn) rollback() {
	s := cn.s
	var bytes int64
	for _, r := range cn.fresh {
		h := cn.held[r]
		delete(cn.held, r)
		bytes += h.bytes
		h.end()
	}
	for _, h := range cn.mapped {
		h.maps-- // not sent: the peer maps none of it
	}
	cn.sent() // not sent: the answer is taken back
	for _, id := range cn.grants {
		delete(cn.leases, id)
	}
	holding := 0
	if len(cn.fresh) > 0 && len(cn.held) == 0 {
		holding = 1
	}
	s.mu.Lock()
	s.useLocked(cn.cred.UID, func(u *use) {
		u.leases -= len(cn.grants)
		u.bytes -= bytes
		u.files -= len(cn.fresh)
		u.hold -= holding
	})
	s.mu.Unlock()
	cn.grants, cn.fresh = cn.grants[:0], cn.fresh[:0]
}
