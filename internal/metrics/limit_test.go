package metrics

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"go.uber.org/zap"
)

// serveWith serves a fresh registry under limits; it is closed in
// t.Cleanup.
func serveWith(t *testing.T, limits serveLimits) *Metrics {
	t.Helper()
	m := New(func() map[string]any { return map[string]any{"opens": float64(1)} })
	m.limits = limits
	if err := m.Serve("127.0.0.1:0", zap.NewNop()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	return m
}

// waitEOF reads c until the server closes it. The deadline only stops a
// failing test from hanging.
func waitEOF(t *testing.T, c net.Conn) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(time.Minute))
	if _, err := io.Copy(io.Discard, c); err != nil {
		if errors.Is(err, net.ErrClosed) || isTimeout(err) {
			t.Fatalf("%s: the server did not close the connection: %v", c.LocalAddr(), err)
		}
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// TestConnectionsBounded: of bound+N idle connections the server holds at
// most bound at once; the others wait in the kernel's queue and are served
// (here: timed out and closed) as slots free up.
func TestConnectionsBounded(t *testing.T) {
	const bound, extra = 3, 5
	m := serveWith(t, serveLimits{conns: bound, readHeader: 100 * time.Millisecond, read: time.Minute,
		write: time.Minute, idle: time.Minute})
	var conns []net.Conn
	for i := 0; i < bound+extra; i++ {
		c, err := net.Dial("tcp", m.Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conns = append(conns, c)
	}
	// Each EOF says the server accepted the connection and, no request
	// header coming, closed it.
	for _, c := range conns {
		waitEOF(t, c)
	}
	if peak := m.ln.peak.Load(); peak > bound {
		t.Fatalf("the server held %d connections at once, bound %d", peak, bound)
	}
	// A slot is free again: a scrape is answered.
	resp, err := http.Get("http://" + m.Addr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape after the idle connections: %s", resp.Status)
	}
}

// TestIdleConnectionClosed: a kept-alive connection that sends no second
// request is closed after the idle timeout.
func TestIdleConnectionClosed(t *testing.T) {
	m := serveWith(t, serveLimits{conns: 4, readHeader: time.Minute, read: time.Minute,
		write: time.Minute, idle: 100 * time.Millisecond})
	c, err := net.Dial("tcp", m.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.Close {
		t.Fatal("the server closed after the first response: keep-alive is what this test needs")
	}
	c.SetReadDeadline(time.Now().Add(time.Minute))
	if n, err := br.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("idle kept-alive connection: read %d bytes, %v; want EOF from the server", n, err)
	}
}

// TestDefaultLimits: the endpoint as the daemon serves it is bounded.
func TestDefaultLimits(t *testing.T) {
	l := New(nil).limits
	if l.conns <= 0 || l.readHeader <= 0 || l.read <= 0 || l.write <= 0 || l.idle <= 0 {
		t.Fatalf("limits %+v: every one must be set", l)
	}
}
