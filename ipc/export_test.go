package ipc

import "net"

// ListenerFunc wraps the server's listener before Serve (tests inject
// Accept failures).
func WrapListener(s *Server, wrap func(accept func() (*net.UnixConn, error)) func() (*net.UnixConn, error)) {
	s.ln = &funcListener{accept: wrap(s.ln.AcceptUnix), close: s.ln.Close}
}

type funcListener struct {
	accept func() (*net.UnixConn, error)
	close  func() error
}

func (l *funcListener) AcceptUnix() (*net.UnixConn, error) { return l.accept() }
func (l *funcListener) Close() error                       { return l.close() }

// OnConnClosed calls fn each time a connection's end has been accounted
// (its leases ended, its bytes no longer held). Set it before Serve.
func OnConnClosed(s *Server, fn func()) { s.onClosed = fn }

// OnWaiting calls fn each time a wait or wait_stat blocks (after it found
// its condition unmet). Set it before Serve.
func OnWaiting(s *Server, fn func()) { s.onWaiting = fn }

// Use is what uid has open: connections, lease ids, bytes and files held.
type Use struct {
	Conns, Leases int
	Bytes         int64
	Files         int
}

// UseOf is uid's Use.
func UseOf(s *Server, uid uint32) Use {
	s.mu.Lock()
	defer s.mu.Unlock()
	u := s.uids[uid]
	if u == nil {
		return Use{}
	}
	return Use{Conns: u.conns, Leases: u.leases, Bytes: u.bytes, Files: u.files}
}
