package client

import (
	"bytes"
	"runtime"
	"slices"
	"testing"

	"github.com/gdsfs/gdsfs/proto"
)

// TestDropFollowsReleaseOnBusyConnection: a lease closed while another
// request of the process uses its pooled connection (so its release and
// its drop are sent once that request is answered) must reach the
// daemon as release, then drop: the daemon refuses a drop of bytes a
// lease still names (EBUSY), and a refused drop leaves them held for as
// long as the pooled connection stays open. Each round is ordered by
// events only; one goroutine scheduler (GOMAXPROCS 1) would make any
// order the scheduler picks for the notices the one they are sent in.
func TestDropFollowsReleaseOnBusyConnection(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	data := bytes.Repeat([]byte("o"), 4096)
	m := newMemfds(t)
	gates := make(chan chan struct{}, 1)
	f := newScripted(t, func(n int, req proto.Request) reply {
		switch {
		case req.Op == proto.OpRelease:
			return okAnswer()
		case req.Path == "a":
			g := grant(10, 1, 4096, 4096)
			g["cache"] = false // not kept: Close unmaps it and drops it
			return reply{line: js(g), fds: []int{m.make(data, 4096)}}
		}
		<-<-gates
		return reply{line: js(grant(11, 2, 4096, 4096)), fds: []int{m.make(data, 4096)}}
	})
	for round := range 20 {
		gate := make(chan struct{})
		gates <- gate
		a, err := Open(f.path("a"))
		if err != nil {
			t.Fatal(err)
		}
		f.expect(proto.OpAcquire, 0)
		type result struct {
			l   *Lease
			err error
		}
		done := make(chan result)
		go func() {
			l, err := Open(f.path("c")) // on a's connection, answered once the gate opens
			done <- result{l, err}
		}()
		if r := f.expect(proto.OpAcquire, 0); r.Path != "c" {
			t.Fatalf("the busy request is for %q, want c", r.Path)
		}
		a.Close()         // its connection busy: release and drop wait for c's answer
		runtime.Gosched() // let anything else that would send them run first
		close(gate)
		c := <-done
		if c.err != nil {
			t.Fatal(c.err)
		}
		f.expect(proto.OpRelease, 10)
		<-f.drops
		ops := f.opsOn(round)
		if i, j := slices.Index(ops, proto.OpRelease), slices.Index(ops, proto.OpDrop); j < i {
			t.Fatalf("round %d: connection %d read %v: the drop of a before its release", round, round, ops)
		}
		c.l.Close()
		f.expect(proto.OpRelease, 11)
		DropCache()
		f.closed(round)
	}
	f.none()
	m.clean()
}

// TestNoticesQueuedWhileHeldAreSentByTheHolder: a release and a drop made
// while a request holds the connection are queued, not sent, and the
// holder sends them, in the order they were made, when it is done with
// the connection, with no request after them.
func TestNoticesQueuedWhileHeldAreSentByTheHolder(t *testing.T) {
	f := newScripted(t, func(n int, req proto.Request) reply { return okAnswer() })
	c, err := Dial(f.sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	queued := func() int {
		c.qmu.Lock()
		defer c.qmu.Unlock()
		return len(c.queued)
	}
	c.mu.Lock() // as a request using the connection does
	c.release(10, 7)
	c.drop(1, "host")
	if n := queued(); n != 2 {
		t.Fatalf("%d notices queued while the connection is held, want 2", n)
	}
	c.unlock() // the holder is done
	if n := queued(); n != 0 {
		t.Fatalf("%d notices still queued once the holder was done", n)
	}
	f.expect(proto.OpRelease, 10)
	if d := <-f.drops; d.n != 0 || d.req.Generation != 1 || d.req.Device != "host" {
		t.Fatalf("dropped %+v on connection %d, want generation 1 on host on connection 0", d.req, d.n)
	}
	if ops := f.opsOn(0); !slices.Equal(ops, []string{proto.OpRelease, proto.OpDrop}) {
		t.Fatalf("connection 0 read %v, want the release, then the drop", ops)
	}
}
