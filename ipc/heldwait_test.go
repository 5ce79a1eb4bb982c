package ipc_test

import (
	"strings"
	"testing"
	"time"

	"github.com/gdsfs/gdsfs/internal/units"
	"github.com/gdsfs/gdsfs/ipc"
	"github.com/gdsfs/gdsfs/proto"
)

// startHeld is a server whose ipc.max_held_per_uid is 100 KiB (64 KiB
// chunks: one of the test files fits, two do not), with a channel that
// hears each time a wait blocks. a and b hold 60 KiB each.
func startHeld(t *testing.T, timeout time.Duration) (*fixture, chan struct{}) {
	blocked := make(chan struct{}, 1000)
	f := start(t, ipc.SharingShared, setup{
		opts: func(o *ipc.Options) {
			o.MaxHeldPerUID = units.Share{Bytes: 100 << 10}
			o.AcquireTimeout = timeout
		},
		before: func(s *ipc.Server) { ipc.OnWaiting(s, func() { blocked <- struct{}{} }) },
	})
	f.write(t, "a", pattern(60<<10, 1))
	f.write(t, "b", pattern(60<<10, 2))
	return f, blocked
}

func acquireReq(path string) proto.Request { return proto.Request{Op: proto.OpAcquire, Path: path} }

// TestHeldLimitWaits: one uid's workers, one connection each, over
// ipc.max_held_per_uid: the acquire past the limit waits (rather than
// failing with EDQUOT at once) and is served when a connection of that uid
// closes, first come first served; another uid is not held up meanwhile.
func TestHeldLimitWaits(t *testing.T) {
	f, blocked := startHeld(t, 20*time.Second)
	h1 := dialAs(t, f.srv.Path(), nobody, nobody)
	if resp, _ := h1.do(acquireReq("a")); !resp.OK {
		t.Fatalf("first acquire: %+v", resp)
	}
	h2, h3 := dialAs(t, f.srv.Path(), nobody, nobody), dialAs(t, f.srv.Path(), nobody, nobody)
	h2.c.Write(line(acquireReq("b")))
	isBlocked(t, blocked)
	h3.c.Write(line(acquireReq("a")))
	isBlocked(t, blocked)
	if resp, _ := dial(t, f.srv.Path()).do(acquireReq("b")); !resp.OK {
		t.Fatalf("root, while uid %d waits: %+v", nobody, resp)
	}
	h1.c.Close() // room for one file of uid nobody: the oldest waiter's
	if resp, _ := h2.next(); !resp.OK || resp.Size != 60<<10 {
		t.Fatalf("first waiter, after the holder closed: %+v", resp)
	}
	h2.c.Close()
	if resp, _ := h3.next(); !resp.OK || resp.Size != 60<<10 {
		t.Fatalf("second waiter, after the first closed: %+v", resp)
	}
	if st := f.srv.Stats(); st.HeldBytes != 2*(60<<10) {
		t.Fatalf("held %d bytes, want root's b and h3's a (%d)", st.HeldBytes, 2*(60<<10))
	}
}

// TestHeldLimitNeverFits: a file larger than the limit, or one that with
// what its own connection holds passes it, is refused at once: no wait.
func TestHeldLimitNeverFits(t *testing.T) {
	f, blocked := startHeld(t, 20*time.Second)
	f.write(t, "big", pattern(200<<10, 3))
	r := dialAs(t, f.srv.Path(), nobody, nobody)
	if resp, _ := r.do(acquireReq("big")); resp.Errno != "EDQUOT" || !strings.Contains(resp.Error, "never") {
		t.Fatalf("a file past the limit alone: %+v, want EDQUOT at once", resp)
	}
	if resp, _ := r.do(acquireReq("a")); !resp.OK {
		t.Fatal(resp.Error)
	}
	if resp, _ := r.do(acquireReq("b")); resp.Errno != "EDQUOT" || !strings.Contains(resp.Error, "while this connection is open") {
		t.Fatalf("a second file on the holding connection: %+v, want EDQUOT at once", resp)
	}
	if len(blocked) != 0 {
		t.Fatal("a request that can never fit waited")
	}
}

// TestHeldLimitTimesOut: a wait for the uid's room that outlasts
// ipc.acquire_timeout answers EDQUOT, saying it waited.
func TestHeldLimitTimesOut(t *testing.T) {
	f, blocked := startHeld(t, 300*time.Millisecond)
	h := dialAs(t, f.srv.Path(), nobody, nobody)
	if resp, _ := h.do(acquireReq("a")); !resp.OK {
		t.Fatal(resp.Error)
	}
	resp, _ := dialAs(t, f.srv.Path(), nobody, nobody).do(acquireReq("b"))
	if resp.Errno != "EDQUOT" || !strings.Contains(resp.Error, "waited") || !strings.Contains(resp.Error, "ipc.acquire_timeout") {
		t.Fatalf("acquire past the limit while the holder stays: %+v, want EDQUOT after waiting", resp)
	}
	if len(blocked) == 0 {
		t.Fatal("the acquire past the limit never waited")
	}
	if st := f.srv.Stats(); st.HeldBytes != 60<<10 {
		t.Fatalf("held %d bytes after the timeout, want the holder's %d", st.HeldBytes, 60<<10)
	}
}

// TestHeldLimitKeepsRoom: a grant lets the client keep the file mapped
// after release (the repeat-lease cache) only while ipc.cache_headroom of
// the uid's ipc.max_held_per_uid stays free. Kept files hold their bytes
// until the client drops them, and a client blocked in its next acquire
// does not: workers of one uid that each kept a file waited for room only
// their kept files held (bench contention on the host hung this way).
func TestHeldLimitKeepsRoom(t *testing.T) {
	f := start(t, ipc.SharingShared, setup{opts: func(o *ipc.Options) {
		o.MaxHeldPerUID = units.Share{Bytes: 100 << 10}
		o.CacheHeadroom = units.Share{Bytes: 50 << 10}
	}})
	f.write(t, "a", pattern(30<<10, 1))
	f.write(t, "b", pattern(30<<10, 2))
	a, _ := dialAs(t, f.srv.Path(), nobody, nobody).do(acquireReq("a"))
	if !a.OK || !a.Cache {
		t.Fatalf("first file, 70 KiB of the uid's 100 KiB left: %+v, want cache", a)
	}
	b, _ := dialAs(t, f.srv.Path(), nobody, nobody).do(acquireReq("b"))
	if !b.OK || b.Cache {
		t.Fatalf("second file, 40 KiB of the uid's 100 KiB left (headroom 50 KiB): %+v, want no cache", b)
	}
	if c, _ := dial(t, f.srv.Path()).do(acquireReq("b")); !c.OK || !c.Cache {
		t.Fatalf("root, with its own room: %+v, want cache", c)
	}
}
