package metrics

import (
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// serveLimits bound what clients of the endpoint can hold of the daemon:
// each connection is a descriptor, and the daemon's descriptors serve the
// mount.
type serveLimits struct {
	conns      int           // connections held at once; more wait in the kernel's accept queue
	readHeader time.Duration // to read a request's header
	read       time.Duration // to read a whole request
	write      time.Duration // to write a response
	idle       time.Duration // a kept-alive connection waiting for its next request
}

// defaultLimits suit a few Prometheus scrapers: a scrape takes well under a
// second and comes every 10-60 s.
var defaultLimits = serveLimits{
	conns:      16,
	readHeader: 5 * time.Second,
	read:       10 * time.Second,
	write:      30 * time.Second,
	idle:       30 * time.Second,
}

// limitListener accepts a connection only while fewer than cap(slots) are
// open: the ones over the bound stay queued in the kernel and take no
// descriptor of the daemon.
type limitListener struct {
	net.Listener
	slots     chan struct{} // one entry per connection held
	done      chan struct{} // closed by Close: Accept stops waiting for a slot
	closeOnce sync.Once
	peak      atomic.Int32 // the most connections held at once
}

func newLimitListener(l net.Listener, n int) *limitListener {
	return &limitListener{Listener: l, slots: make(chan struct{}, n), done: make(chan struct{})}
}

func (l *limitListener) Accept() (net.Conn, error) {
	select {
	case l.slots <- struct{}{}:
	case <-l.done:
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.slots
		return nil, err
	}
	if n := int32(len(l.slots)); n > l.peak.Load() {
		l.peak.Store(n) // only Accept's goroutine stores
	}
	return &limitConn{Conn: c, release: func() { <-l.slots }}, nil
}

func (l *limitListener) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// limitConn gives its slot back when closed.
type limitConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
