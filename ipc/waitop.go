package ipc

// Waiting without polling. wait answers when a file reaches one of the
// states asked for, woken by the staging cache's events (Cache.Subscribe);
// wait_stat answers when one of the server's lease counters reaches a
// value, woken by the server's broadcast of its own changes (changed).
// While a wait blocks, the connection is watched: a peer that goes away
// ends its wait.

import (
	"context"
	"errors"
	"os"
	"time"

	"github.com/gdsfs/gdsfs/proto"
	"github.com/gdsfs/gdsfs/staging"
)

var errPeerGone = errors.New("the client closed the connection")

// wait answers when rel's state (as stat answers it) is one of req.Until:
// at once if it is already, or at the first change into one of them, or
// ETIMEDOUT after req.TimeoutMS. The file is opened as the peer first, as
// stat does: a peer that may not read it is refused.
func (cn *conn) wait(req proto.Request) proto.Response {
	s := cn.s
	rel, size, err := cn.readable(req.Path)
	if err != nil {
		return cn.fail(err)
	}
	// Subscribe before reading the state: a change after the read is an
	// event, so none is missed.
	wake := make(chan struct{}, 1)
	stop := s.cfg.Cache.Subscribe(func(e staging.Event) {
		if e.Rel == rel {
			select {
			case wake <- struct{}{}:
			default:
			}
		}
	})
	defer stop()
	ctx, done := cn.waitContext(req.TimeoutMS)
	defer done()
	for {
		state, loadPath := s.cfg.Cache.Attr(rel)
		if proto.StateIn(state, req.Until) {
			return cn.described(rel, size, state, loadPath)
		}
		if err := cn.block(ctx, wake); err != nil {
			return cn.fail(cn.waitErr(err, "%s is %s after %dms, not %v", rel, state, req.TimeoutMS, req.Until))
		}
	}
}

// waitStat answers when the counter req.Key equals req.Value.
func (cn *conn) waitStat(req proto.Request) proto.Response {
	s := cn.s
	ctx, done := cn.waitContext(req.TimeoutMS)
	defer done()
	for {
		s.mu.Lock()
		v := s.counterLocked(req.Key)
		changed := s.changed
		s.mu.Unlock()
		if v == *req.Value {
			return cn.ok()
		}
		if err := cn.block(ctx, changed); err != nil {
			return cn.fail(cn.waitErr(err, "%s is %d after %dms, not %d", req.Key, v, req.TimeoutMS, *req.Value))
		}
	}
}

// counterLocked is a wait_stat key's value. ipc_open_connections leaves
// out the asking connection. s.mu must be held.
func (s *Server) counterLocked(key string) int64 {
	switch key {
	case proto.StatOpenConnections:
		return int64(s.total.conns - 1)
	case proto.StatLeasesActive:
		return int64(s.total.leases)
	case proto.StatHeldBytes:
		return s.total.bytes
	case proto.StatHeldFiles:
		return int64(s.total.files)
	case proto.StatHoldingConnections:
		return int64(s.total.hold)
	}
	panic("ipc: wait_stat key " + key + " passed proto's check") // proto.WaitStatKeys
}

// changedLocked wakes every wait_stat: one of the counters changed. s.mu
// must be held.
func (s *Server) changedLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// waitContext bounds a wait by ms, the request's context (the server's
// life, a hand-over) and the peer's: the connection is read meanwhile
// (watchPeer). done ends the watch; bytes the peer sent meanwhile are
// kept for the next readLine.
func (cn *conn) waitContext(ms int64) (context.Context, func()) {
	tctx, tcancel := context.WithTimeout(cn.ctx, time.Duration(ms)*time.Millisecond)
	ctx, cancel := context.WithCancelCause(tctx)
	stop := cn.watchPeer(cancel)
	return ctx, func() {
		stop()
		cancel(nil)
		tcancel()
	}
}

// watchPeer reads the connection while a wait blocks (its handler reads
// nothing then): end of file or an error cancels the wait with
// errPeerGone. It reads at most ipc.max_request bytes ahead. stop ends the
// read and hands what arrived to readLine.
func (cn *conn) watchPeer(cancel context.CancelCauseFunc) (stop func()) {
	got := make(chan []byte, 1)
	cn.c.SetReadDeadline(time.Time{}) // the idle deadline does not run out under a wait
	go func() {
		var b []byte
		buf := make([]byte, 4096)
		for len(b) <= int(cn.s.cfg.Options.MaxRequest) {
			n, err := cn.c.Read(buf)
			b = append(b, buf[:n]...)
			if err != nil {
				if !errors.Is(err, os.ErrDeadlineExceeded) {
					cancel(errPeerGone)
				}
				break
			}
		}
		got <- b
	}()
	return func() {
		cn.c.SetReadDeadline(time.Unix(1, 0)) // in the past: ends the read
		b := <-got
		if len(b) > 0 {
			if len(cn.buf) == 0 {
				cn.lineStart = time.Now()
			}
			cn.buf = append(cn.buf, b...)
		}
	}
}

// block waits for wake or the end of ctx.
func (cn *conn) block(ctx context.Context, wake <-chan struct{}) error {
	if cn.s.onWaiting != nil {
		cn.s.onWaiting()
	}
	select {
	case <-wake:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// waitErr words the end of a wait that did not see its condition:
// ETIMEDOUT (with the message format makes), or why it was cut short.
func (cn *conn) waitErr(err error, format string, a ...any) error {
	switch {
	case errors.Is(err, errPeerGone):
		return proto.Errorf(proto.EIO, "%v", err) // nobody reads it
	case cn.s.ctx.Err() != nil:
		return proto.Errorf(proto.EIO, "the daemon is stopping")
	}
	return proto.Errorf(proto.ETIMEDOUT, format, a...)
}
