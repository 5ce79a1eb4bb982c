package ipc_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gdsfs/gdsfs/ipc"
	"github.com/gdsfs/gdsfs/proto"
)

// startWaits is start with a channel that hears each time a wait blocks
// (its condition unmet, waiting for a change).
func startWaits(t *testing.T) (*fixture, chan struct{}) {
	blocked := make(chan struct{}, 1000)
	f := start(t, ipc.SharingShared, setup{before: func(s *ipc.Server) {
		ipc.OnWaiting(s, func() { blocked <- struct{}{} })
	}})
	return f, blocked
}

func waitReq(path string, ms int64, until ...string) proto.Request {
	return proto.Request{Op: proto.OpWait, Path: path, Until: until, TimeoutMS: ms}
}

func waitStatReq(key string, v, ms int64) proto.Request {
	return proto.Request{Op: proto.OpWaitStat, Key: key, Value: &v, TimeoutMS: ms}
}

func line(r proto.Request) []byte { return r.Line() }

// isBlocked waits until a wait has blocked.
func isBlocked(t *testing.T, blocked chan struct{}) {
	t.Helper()
	select {
	case <-blocked:
	case <-time.After(20 * time.Second):
		t.Fatal("the wait did not block")
	}
}

// TestWaitAnswersAtOnce: a file already in a state asked for is answered
// at once, with its state, load path and size, never blocking.
func TestWaitAnswersAtOnce(t *testing.T) {
	f, blocked := startWaits(t)
	f.write(t, "a", pattern(70000, 1))
	f.write(t, "b", pattern(100, 2))
	c := dial(t, f.srv.Path())
	if resp, _ := c.do(proto.Request{Op: proto.OpAcquire, Path: "a"}); !resp.OK {
		t.Fatal(resp.Error)
	}
	resp, _ := c.do(waitReq("a", 60000, proto.StateResident, proto.StateFailed))
	if !resp.OK || resp.State != "resident" || resp.LoadPath != "host" || resp.Size != 70000 {
		t.Fatalf("wait for a resident file: %+v", resp)
	}
	resp, _ = c.do(waitReq("/mnt/gds/b", 60000, proto.StateAbsent))
	if !resp.OK || resp.State != "absent" || resp.Size != 100 {
		t.Fatalf("wait for an absent file to be absent: %+v", resp)
	}
	if n := len(blocked); n != 0 {
		t.Fatalf("a wait whose state was there blocked %d times", n)
	}
}

// TestWaitWakesOnLoad: a wait on an absent file blocks, and is answered
// when a load of it finishes (host backend); a request the client sent
// behind it is answered after it.
func TestWaitWakesOnLoad(t *testing.T) {
	f, blocked := startWaits(t)
	f.write(t, "a", pattern(300000, 3))
	w := dial(t, f.srv.Path())
	req := append(line(waitReq("a", 60000, proto.StateResident, proto.StateFailed)),
		(&proto.Request{Op: proto.OpStat, Path: "a"}).Line()...)
	w.c.Write(req)
	isBlocked(t, blocked)
	if _, err := f.cache.Stage(context.Background(), "a"); err != nil {
		t.Fatal(err)
	}
	if resp, _ := w.next(); !resp.OK || resp.State != "resident" || resp.LoadPath != "host" {
		t.Fatalf("wait answered %+v, want resident", resp)
	}
	if resp, _ := w.next(); !resp.OK || resp.State != "resident" {
		t.Fatalf("the stat sent behind the wait: %+v", resp)
	}
}

// TestWaitTimesOut: a state that does not come is ETIMEDOUT after
// timeout_ms, saying what the state is.
func TestWaitTimesOut(t *testing.T) {
	f, _ := startWaits(t)
	f.write(t, "a", pattern(100, 4))
	resp, _ := dial(t, f.srv.Path()).do(waitReq("a", 50, proto.StateResident))
	if resp.OK || resp.Errno != "ETIMEDOUT" || !strings.Contains(resp.Error, "absent") {
		t.Fatalf("wait that cannot end: %+v, want ETIMEDOUT saying the file is absent", resp)
	}
	v := int64(3)
	resp, _ = dial(t, f.srv.Path()).do(proto.Request{Op: proto.OpWaitStat, Key: proto.StatLeasesActive, Value: &v, TimeoutMS: 50})
	if resp.OK || resp.Errno != "ETIMEDOUT" {
		t.Fatalf("wait_stat that cannot end: %+v", resp)
	}
}

// TestWaitRefusesUnreadable: a wait is checked as stat is, by opening the
// file as the asker: a file uid 65534 may not read is EACCES, whatever
// its state.
func TestWaitRefusesUnreadable(t *testing.T) {
	f, blocked := startWaits(t)
	p := f.write(t, "secret", pattern(5000, 5))
	os.Chmod(p, 0o600)
	f.write(t, "open", pattern(5000, 6))
	c := dialAs(t, f.srv.Path(), 65534, 65534)
	if resp, _ := c.do(waitReq("secret", 60000, proto.StateAbsent)); resp.OK || resp.Errno != "EACCES" {
		t.Fatalf("wait on a file the peer may not read: %+v, want EACCES", resp)
	}
	if resp, _ := c.do(waitReq("open", 60000, proto.StateAbsent)); !resp.OK {
		t.Fatalf("wait on a file the peer may read: %+v", resp)
	}
	if len(blocked) != 0 {
		t.Fatal("a refused wait blocked")
	}
}

// TestWaitStatWakesOnClose: wait_stat on lease_held_bytes blocks while a
// connection holds a file, and is answered when that connection closes.
func TestWaitStatWakesOnClose(t *testing.T) {
	f, blocked := startWaits(t)
	f.write(t, "a", pattern(70000, 7))
	h := dial(t, f.srv.Path())
	if resp, _ := h.do(proto.Request{Op: proto.OpAcquire, Path: "a"}); !resp.OK {
		t.Fatal(resp.Error)
	}
	w := dial(t, f.srv.Path())
	if resp, _ := w.do(waitStatReq(proto.StatLeasesActive, 1, 60000)); !resp.OK {
		t.Fatalf("wait_stat for the value there: %+v", resp)
	}
	w.c.Write(line(waitStatReq(proto.StatHeldBytes, 0, 60000)))
	isBlocked(t, blocked)
	h.c.Close()
	if resp, _ := w.next(); !resp.OK {
		t.Fatalf("wait_stat after the holder closed: %+v", resp)
	}
	if st := f.srv.Stats(); st.HeldBytes != 0 || st.LeasesActive != 0 {
		t.Fatalf("stats after the answer: %+v", st)
	}
}

// TestWaitEndsWithItsPeer: a client that closes its connection while its
// wait blocks ends the wait and the connection at once (not at its
// timeout): ipc_open_connections, which leaves out the asking connection,
// reaches 0.
func TestWaitEndsWithItsPeer(t *testing.T) {
	f, blocked := startWaits(t)
	f.write(t, "a", pattern(100, 8))
	w := dial(t, f.srv.Path())
	w.c.Write(line(waitReq("a", proto.MaxWaitMS, proto.StateResident)))
	isBlocked(t, blocked)
	w.c.Close()
	if resp, _ := dial(t, f.srv.Path()).do(waitStatReq(proto.StatOpenConnections, 0, 20000)); !resp.OK {
		t.Fatalf("the waiting connection's end: %+v", resp)
	}
}
