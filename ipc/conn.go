package ipc

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/gdsfs/gdsfs"
	"github.com/gdsfs/gdsfs/gpu"
	"github.com/gdsfs/gdsfs/internal/access"
	"github.com/gdsfs/gdsfs/proto"
)

// conn is one client connection, served by one goroutine: its fields are
// that goroutine's alone.
type conn struct {
	s       *Server
	c       *net.UnixConn
	cred    access.Cred
	credErr error // why the peer's credentials are unknown, if they are
	// held: the files handed out on this connection, by region. They stay
	// leased (counted, never evicted) until the connection closes.
	held map[gpu.Region]*held
	// leases: lease ids granted and not released.
	leases map[uint64]*held

	buf       []byte    // received bytes not yet consumed
	rbuf      []byte    // read buffer
	lineStart time.Time // when the first byte of the pending line arrived

	// The request being handled: its context (Server.reqCtx when it
	// began), and the lease ids and held files it granted so far, undone
	// if a hand-over cuts it short (handover.go).
	ctx    context.Context
	grants []uint64
	fresh  []gpu.Region
	mapped []*held // full grants it made, each one more mapping (held.maps)
	// answering: the descriptors the answer being made carries, by
	// region (an answer exports a region once however many of its items
	// name it), closed once it is sent (or taken back): the peer has its
	// own then.
	answering map[gpu.Region][]*os.File
	// abandoned: the server was handed over; the connection ends without
	// ending what it held (the successor holds it).
	abandoned bool
}

var (
	errTooLong = errors.New("request too long")
)

func (s *Server) serveConn(c *net.UnixConn) {
	cn := &conn{s: s, c: c, held: map[gpu.Region]*held{}, leases: map[uint64]*held{}}
	cn.cred, cn.credErr = peerCred(c)
	if err := s.admit(cn); err != nil {
		defer s.wg.Done()
		defer s.done()
		s.refused.Add(1)
		cn.send(cn.fail(err), nil)
		c.Close()
		return
	}
	cn.serve()
}

// serve answers the connection's requests until it ends. While the
// server is handed off it parks between requests (park).
func (cn *conn) serve() {
	s := cn.s
	defer s.wg.Done()
	defer s.done()
	defer func() {
		if cn.abandoned {
			cn.c.Close() // the successor serves it now
			return
		}
		cn.close()
	}()
	for cn.park() {
		line, err := cn.readLine()
		switch {
		case errors.Is(err, errPaused):
			continue
		case errors.Is(err, errTooLong):
			s.bad.Add(1)
			cn.answer("invalid", time.Now(), cn.fail(proto.Errorf(proto.E2BIG,
				"request longer than ipc.max_request (%s); closing the connection", s.cfg.Options.MaxRequest)), nil)
			return // the stream cannot be resynchronised
		case errors.Is(err, os.ErrDeadlineExceeded) && len(cn.buf) > 0:
			s.timeouts.Add(1)
			cn.send(cn.fail(proto.Errorf(proto.ETIMEDOUT,
				"request line not finished within ipc.request_timeout (%s); closing the connection", s.cfg.Options.RequestTimeout)), nil)
			return
		case errors.Is(err, os.ErrDeadlineExceeded):
			s.timeouts.Add(1) // idle, holding nothing: ipc.idle_timeout
			return
		case err != nil:
			return // EOF, a reset, or Close
		}
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		start := time.Now()
		s.requests.Add(1)
		cn.begin()
		op, resp, fds := cn.handle(line)
		if cn.cutShort(op, line) {
			continue
		}
		err = cn.answer(op, start, resp, fds)
		cn.sent()
		if err != nil {
			return
		}
	}
}

// answer sends resp with fds and reports it to Config.Observe.
func (cn *conn) answer(op string, start time.Time, resp proto.Response, fds []int) error {
	err := cn.send(resp, fds)
	if obs := cn.s.cfg.Observe; obs != nil {
		obs(op, time.Since(start), resp.Err())
	}
	return err
}

// admit counts cn against ipc.max_connections and its uid's
// ipc.max_connections_per_uid, or says which bound it would pass.
func (s *Server) admit(cn *conn) error {
	o := &s.cfg.Options
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return proto.Errorf(proto.EMFILE, "the daemon is stopping")
	}
	u := s.uids[cn.cred.UID]
	switch {
	case s.total.conns >= o.MaxConnections:
		return proto.Errorf(proto.EMFILE, "more than ipc.max_connections (%d) clients", o.MaxConnections)
	case u != nil && u.conns >= o.ConnectionsPerUID():
		return proto.Errorf(proto.EMFILE, "uid %d has ipc.max_connections_per_uid (%d) connections open", cn.cred.UID, o.ConnectionsPerUID())
	}
	s.useLocked(cn.cred.UID, func(u *use) { u.conns++ })
	s.active[cn] = true
	return nil
}

// useLocked applies fn to uid's use and to the total, and wakes the
// wait_stat waiters. s.mu must be held.
func (s *Server) useLocked(uid uint32, fn func(*use)) {
	u := s.uids[uid]
	if u == nil {
		u = &use{}
		s.uids[uid] = u
	}
	fn(u)
	fn(&s.total)
	if *u == (use{}) {
		delete(s.uids, uid)
	}
	s.changedLocked()
}

// close ends everything the connection held.
func (cn *conn) close() {
	s := cn.s
	cn.c.Close()
	var bytes int64
	for _, h := range cn.held {
		bytes += h.bytes
		h.end()
	}
	cn.sent()
	s.mu.Lock()
	holding := 0
	if len(cn.held) > 0 {
		holding = 1
	}
	s.useLocked(cn.cred.UID, func(u *use) {
		u.conns--
		u.leases -= len(cn.leases)
		u.bytes -= bytes
		u.files -= len(cn.held)
		u.hold -= holding
	})
	delete(s.active, cn)
	s.mu.Unlock()
	cn.held, cn.leases = nil, nil
	if s.onClosed != nil {
		s.onClosed()
	}
}

// sent closes the descriptors of the answer just sent.
func (cn *conn) sent() {
	for _, files := range cn.answering {
		closeFiles(files)
	}
	clear(cn.answering)
}

func closeFiles(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}

// readLine returns the next request line. While the connection holds
// nothing, waiting for a line is bounded by ipc.idle_timeout; once a line
// has started, its end must come within ipc.request_timeout.
func (cn *conn) readLine() ([]byte, error) {
	o := &cn.s.cfg.Options
	max := int(o.MaxRequest)
	if cn.rbuf == nil {
		cn.rbuf = make([]byte, 4096)
	}
	for {
		if i := bytes.IndexByte(cn.buf, '\n'); i >= 0 {
			line := cn.buf[:i+1]
			cn.buf = cn.buf[i+1:]
			if len(cn.buf) > 0 {
				cn.lineStart = time.Now()
			}
			if len(line) > max {
				return nil, errTooLong
			}
			return line, nil
		}
		if len(cn.buf) > max {
			return nil, errTooLong
		}
		var deadline time.Time
		switch {
		case len(cn.buf) > 0:
			deadline = cn.lineStart.Add(o.RequestTimeout)
		case len(cn.held) == 0:
			deadline = time.Now().Add(o.IdleTimeout)
		}
		if err := cn.armRead(deadline); err != nil {
			return nil, err
		}
		n, err := cn.c.Read(cn.rbuf)
		if n > 0 {
			if len(cn.buf) == 0 {
				cn.lineStart = time.Now()
			}
			cn.buf = append(cn.buf, cn.rbuf[:n]...)
		}
		if errors.Is(err, os.ErrDeadlineExceeded) && cn.s.isPaused() {
			return nil, errPaused
		}
		if err != nil {
			return nil, err
		}
	}
}

// peerCred is who connected: ids, groups and capabilities as the kernel
// recorded them at connect (access.Peer). A peer whose groups or
// capabilities cannot be read keeps its uid and gid: it can only get
// fewer rights than it has, never more.
func peerCred(c *net.UnixConn) (access.Cred, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return access.Cred{UID: ^uint32(0), GID: ^uint32(0)}, err
	}
	var cred access.Cred
	var perr error
	if err := raw.Control(func(fd uintptr) { cred, perr = access.Peer(int(fd)) }); err != nil {
		return access.Cred{UID: ^uint32(0), GID: ^uint32(0)}, err
	}
	return cred, perr
}

// handle answers one request line.
func (cn *conn) handle(line []byte) (string, proto.Response, []int) {
	req, err := proto.DecodeRequest(line)
	if err != nil {
		cn.s.bad.Add(1)
		op := req.Op
		if !knownOp(op) {
			op = "invalid"
		}
		return op, cn.fail(err), nil
	}
	switch req.Op {
	case proto.OpAcquire:
		resp, fds := cn.acquire(req)
		return req.Op, resp, fds
	case proto.OpAcquireMany:
		resp, fds := cn.acquireMany(req)
		return req.Op, resp, fds
	case proto.OpRelease:
		return req.Op, cn.release(req), nil
	case proto.OpDrop:
		return req.Op, cn.drop(req), nil
	case proto.OpStat:
		return req.Op, cn.stat(req), nil
	case proto.OpReport:
		cn.s.reports.add(cn.cred.UID, req.Reason)
		return req.Op, cn.ok(), nil
	case proto.OpWait:
		return req.Op, cn.wait(req), nil
	case proto.OpWaitStat:
		return req.Op, cn.waitStat(req), nil
	default: // hello
		r := cn.ok()
		r.Version, r.Ops, r.MaxFDs = proto.Version, proto.Ops, proto.MaxFDs
		if req.Release != "" {
			r.Release = gdsfs.Version
		}
		r.Devices = cn.s.cfg.Cache.Devices()
		return req.Op, r, nil
	}
}

func knownOp(op string) bool {
	for _, o := range proto.Ops {
		if o == op {
			return true
		}
	}
	return false
}

func (cn *conn) ok() proto.Response { return proto.Response{OK: true, Epoch: cn.s.epoch} }

// fail is the answer for err: its errno (see errnoOf) and message.
func (cn *conn) fail(err error) proto.Response {
	code, msg := errnoOf(err)
	return proto.Response{Epoch: cn.s.epoch, Errno: proto.ErrnoName(code), Error: msg}
}

// send writes one answer line, with fds as SCM_RIGHTS.
func (cn *conn) send(resp proto.Response, fds []int) error {
	cn.c.SetWriteDeadline(time.Now().Add(cn.s.cfg.Options.RequestTimeout))
	err := proto.Send(cn.c, resp.Line(), fds)
	if err != nil && !errors.Is(err, syscall.EPIPE) && !errors.Is(err, syscall.ECONNRESET) {
		cn.s.log.Debug("answer not sent", zap.Uint32("uid", cn.cred.UID), zap.Error(err))
	}
	return err
}
