package ipc_test

import (
	"errors"
	"io"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/gdsfs/gdsfs/internal/units"
	"github.com/gdsfs/gdsfs/ipc"
	"github.com/gdsfs/gdsfs/proto"
)

const nobody = 65534

// TestPerUIDConnectionLimit: one uid at ipc.max_connections_per_uid is
// refused; another uid is still served.
func TestPerUIDConnectionLimit(t *testing.T) {
	f := start(t, ipc.SharingShared, setup{opts: func(o *ipc.Options) { o.MaxConnectionsPerUID = 3 }})
	f.write(t, "a", pattern(10, 1))
	for range 3 {
		r := dialAs(t, f.srv.Path(), nobody, nobody)
		if resp, _ := r.do(proto.Request{Op: proto.OpStat, Path: "a"}); !resp.OK {
			t.Fatalf("stat: %+v", resp)
		}
	}
	r := dialAs(t, f.srv.Path(), nobody, nobody)
	resp, _ := r.do(proto.Request{Op: proto.OpStat, Path: "a"})
	if resp.Errno != "EMFILE" || !strings.Contains(resp.Error, "max_connections_per_uid") {
		t.Fatalf("fourth connection of uid %d: %+v, want EMFILE naming ipc.max_connections_per_uid", nobody, resp)
	}
	if resp, _ := dial(t, f.srv.Path()).do(proto.Request{Op: proto.OpStat, Path: "a"}); !resp.OK {
		t.Fatalf("root refused while uid %d is at its limit: %+v", nobody, resp)
	}
}

// TestTooManyConnections: past ipc.max_connections in all, a connection
// of any uid is refused, naming the bound.
func TestTooManyConnections(t *testing.T) {
	f := start(t, ipc.SharingShared, setup{opts: func(o *ipc.Options) { o.MaxConnections, o.MaxConnectionsPerUID = 4, 2 }})
	for range 2 {
		if resp, _ := dial(t, f.srv.Path()).do(proto.Request{Op: proto.OpHello}); !resp.OK {
			t.Fatalf("root: %+v", resp)
		}
		if resp, _ := dialAs(t, f.srv.Path(), nobody, nobody).do(proto.Request{Op: proto.OpHello}); !resp.OK {
			t.Fatalf("uid %d: %+v", nobody, resp)
		}
	}
	resp, _ := dialAs(t, f.srv.Path(), 1000, 1000).do(proto.Request{Op: proto.OpHello})
	if resp.Errno != "EMFILE" || !strings.Contains(resp.Error, "ipc.max_connections ") {
		t.Fatalf("fifth connection (a third uid): %+v, want EMFILE naming ipc.max_connections", resp)
	}
}

// TestIdleConnectionClosed: a connection holding nothing is closed after
// ipc.idle_timeout; one holding a lease, older than it, is not.
func TestIdleConnectionClosed(t *testing.T) {
	f := start(t, ipc.SharingShared, setup{opts: func(o *ipc.Options) { o.IdleTimeout = 200 * time.Millisecond }})
	f.write(t, "a", pattern(100, 1))
	holder := dial(t, f.srv.Path())
	if resp, _ := holder.do(proto.Request{Op: proto.OpAcquire, Path: "a"}); !resp.OK {
		t.Fatal(resp.Error)
	}
	idle := dial(t, f.srv.Path())
	idle.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := idle.c.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("idle connection: read %v, want EOF (closed by the daemon)", err)
	}
	if resp, _ := holder.do(proto.Request{Op: proto.OpStat, Path: "a"}); !resp.OK {
		t.Fatalf("the connection holding a lease was closed too: %+v", resp)
	}
	if st := f.srv.Stats(); st.Timeouts != 1 {
		t.Fatalf("timeouts %d, want 1", st.Timeouts)
	}
}

// TestHalfLineTimesOut: a request line not finished within
// ipc.request_timeout is answered ETIMEDOUT and its connection closed,
// even one holding a lease; others are served meanwhile.
func TestHalfLineTimesOut(t *testing.T) {
	f := start(t, ipc.SharingShared, setup{opts: func(o *ipc.Options) { o.RequestTimeout = 200 * time.Millisecond }})
	f.write(t, "a", pattern(100, 1))
	half := dial(t, f.srv.Path())
	if resp, _ := half.do(proto.Request{Op: proto.OpAcquire, Path: "a"}); !resp.OK {
		t.Fatal(resp.Error)
	}
	half.c.Write([]byte(`{"op":"st`))
	if resp, _ := dial(t, f.srv.Path()).do(proto.Request{Op: proto.OpStat, Path: "a"}); !resp.OK {
		t.Fatalf("another client beside a half request: %+v", resp)
	}
	resp, _ := half.next()
	if resp.Errno != "ETIMEDOUT" || !strings.Contains(resp.Error, "ipc.request_timeout") {
		t.Fatalf("half request: %+v, want ETIMEDOUT naming ipc.request_timeout", resp)
	}
	if _, err := half.c.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("after the timeout: read %v, want EOF", err)
	}
	f.waitClosed(t, 1)
	if st := f.srv.Stats(); st.HeldFiles != 0 || st.LeasesActive != 0 {
		t.Fatalf("the closed connection's lease is still counted: %+v", st)
	}
}

// TestFloodOfOneUIDLocksOutNobodyElse: with only ipc.max_connections set
// (the per-uid bound left at auto), uid 65534 opening as many idle and
// half-sent connections as the total allows gets a share of them only;
// root and another uid are served during the flood.
func TestFloodOfOneUIDLocksOutNobodyElse(t *testing.T) {
	f := start(t, ipc.SharingShared, setup{opts: func(o *ipc.Options) {
		o.MaxConnections, o.MaxConnectionsPerUID = 8, 0 // auto
	}})
	f.write(t, "a", pattern(100, 1))
	admitted := 0
	for i := range 8 {
		r := dialAs(t, f.srv.Path(), nobody, nobody)
		resp, _ := r.do(proto.Request{Op: proto.OpHello})
		switch {
		case resp.OK:
			admitted++
			if i%2 == 0 {
				r.c.Write([]byte(`{"op":"acquire","pa`)) // and never finished
			}
		case resp.Errno != "EMFILE" || !strings.Contains(resp.Error, "max_connections_per_uid"):
			t.Fatalf("flood connection %d: %+v, want EMFILE naming ipc.max_connections_per_uid", i, resp)
		}
	}
	if admitted != 2 {
		t.Fatalf("uid %d was admitted %d connections, want 2 (a quarter of ipc.max_connections 8)", nobody, admitted)
	}
	if resp, _ := dial(t, f.srv.Path()).do(proto.Request{Op: proto.OpStat, Path: "a"}); !resp.OK {
		t.Fatalf("root during the flood: %+v", resp)
	}
	if resp, _ := dialAs(t, f.srv.Path(), 1000, 1000).do(proto.Request{Op: proto.OpStat, Path: "a"}); !resp.OK {
		t.Fatalf("uid 1000 during the flood: %+v", resp)
	}
}

// TestPerUIDConnectionsAShareOfTheTotal: the per-uid bound is at most half
// of ipc.max_connections whatever is configured; auto is a quarter.
func TestPerUIDConnectionsAShareOfTheTotal(t *testing.T) {
	for _, tc := range []struct {
		total, perUID int
		want          int    // ConnectionsPerUID when valid
		err           string // else: in Validate's error
	}{
		{256, 0, 64, ""},
		{4096, 0, 1024, ""},
		{3, 0, 1, ""},
		{256, 128, 128, ""},
		{256, 1024, 0, "ipc.max_connections_per_uid: 1024 is more than half of ipc.max_connections (256)"},
		{8, 5, 0, "ipc.max_connections_per_uid: 5 is more than half"},
		{1, 0, 0, "ipc.max_connections: 1 is below 2"},
	} {
		o := testOptions(ipc.SharingShared)
		o.MaxConnections, o.MaxConnectionsPerUID = tc.total, units.AutoCount(tc.perUID)
		err := o.Validate()
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("max_connections %d, per uid %d: %v, want an error with %q", tc.total, tc.perUID, err, tc.err)
		case tc.err == "" && err != nil:
			t.Errorf("max_connections %d, per uid %d: %v", tc.total, tc.perUID, err)
		case tc.err == "" && o.ConnectionsPerUID() != tc.want:
			t.Errorf("max_connections %d, per uid %d: %d per uid, want %d", tc.total, tc.perUID, o.ConnectionsPerUID(), tc.want)
		}
	}
}

// TestAcceptErrorsRetried: Accept failures (EMFILE, ECONNABORTED) are
// logged and retried; leasing goes on.
func TestAcceptErrorsRetried(t *testing.T) {
	core, logs := observer.New(zap.WarnLevel)
	f := start(t, ipc.SharingShared, setup{log: zap.New(core), before: func(s *ipc.Server) {
		fails := []error{syscall.EMFILE, syscall.ECONNABORTED, syscall.EMFILE}
		ipc.WrapListener(s, func(accept func() (*net.UnixConn, error)) func() (*net.UnixConn, error) {
			return func() (*net.UnixConn, error) {
				if len(fails) > 0 {
					err := fails[0]
					fails = fails[1:]
					return nil, &net.OpError{Op: "accept", Net: "unix", Err: err}
				}
				return accept()
			}
		})
	}})
	f.write(t, "a", pattern(100, 1))
	if resp, _ := dial(t, f.srv.Path()).do(proto.Request{Op: proto.OpStat, Path: "a"}); !resp.OK {
		t.Fatalf("stat after accept errors: %+v", resp)
	}
	if st := f.srv.Stats(); st.AcceptErrors != 3 {
		t.Fatalf("accept errors counted %d, want 3", st.AcceptErrors)
	}
	if n := logs.FilterMessage("accept failed; retrying").Len(); n != 3 {
		t.Fatalf("%d accept failures logged, want 3", n)
	}
}

// TestPerUIDLeaseAndByteLimits: ipc.max_leases_per_uid, and
// ipc.max_held_per_uid for a file that cannot fit beside what its own
// connection holds, refuse with EDQUOT at once, for that uid only.
func TestPerUIDLeaseAndByteLimits(t *testing.T) {
	f := start(t, ipc.SharingShared, setup{opts: func(o *ipc.Options) {
		o.MaxLeasesPerUID = 2
		o.MaxHeldPerUID = units.Share{Bytes: 100 << 10}
	}})
	f.write(t, "a", pattern(60<<10, 1))
	f.write(t, "b", pattern(60<<10, 2))
	r := dialAs(t, f.srv.Path(), nobody, nobody)
	a1, _ := r.do(proto.Request{Op: proto.OpAcquire, Path: "a"})
	a2, _ := r.do(proto.Request{Op: proto.OpAcquire, Path: "a"}) // the same bytes: no more held
	if !a1.OK || !a2.OK {
		t.Fatalf("two leases of one file: %+v %+v", a1, a2)
	}
	if resp, _ := r.do(proto.Request{Op: proto.OpAcquire, Path: "a"}); resp.Errno != "EDQUOT" || !strings.Contains(resp.Error, "max_leases_per_uid") {
		t.Fatalf("third lease: %+v, want EDQUOT", resp)
	}
	r.do(proto.Request{Op: proto.OpRelease, Lease: a2.Lease})
	if resp, _ := r.do(proto.Request{Op: proto.OpAcquire, Path: "b"}); resp.Errno != "EDQUOT" || !strings.Contains(resp.Error, "max_held_per_uid") {
		t.Fatalf("a second file past the byte bound: %+v, want EDQUOT", resp)
	}
	if resp, _ := dial(t, f.srv.Path()).do(proto.Request{Op: proto.OpAcquire, Path: "b"}); !resp.OK {
		t.Fatalf("root is not bound by uid %d's limits: %+v", nobody, resp)
	}
	var pe *proto.Error
	if err := (&proto.Response{Errno: "EDQUOT"}).Err(); !errors.As(err, &pe) || !errors.Is(err, syscall.EDQUOT) {
		t.Fatalf("EDQUOT answer maps to %v", err)
	}
}
