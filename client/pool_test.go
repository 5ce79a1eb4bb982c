package client

import (
	"bytes"
	"errors"
	"syscall"
	"testing"

	"github.com/gdsfs/gdsfs/proto"
)

// TestBusyPoolConnectsAndDropsAtLimit: a fresh lease while the pool's
// connection is busy with another request dials a new one; refused there
// for the uid's connections (EMFILE), it undoes the kept mappings, and
// drops them on the busy connection once its request is answered (the
// connection stays open for it).
func TestBusyPoolConnectsAndDropsAtLimit(t *testing.T) {
	data := bytes.Repeat([]byte("k"), 4096)
	m := newMemfds(t)
	gate := make(chan struct{})
	f := newScriptedAccept(t, func(n int) reply {
		if n == 0 {
			return reply{}
		}
		return reply{line: js(map[string]any{"ok": false, "errno": "EMFILE", "error": "uid 0 has ipc.max_connections_per_uid (1) connections open"}), hangup: true}
	}, func(n int, req proto.Request) reply {
		switch {
		case req.Op == proto.OpRelease:
			return okAnswer()
		case req.Path == "a":
			return reply{line: js(grant(10, 1, 4096, 4096)), fds: []int{m.make(data, 4096)}}
		}
		<-gate // c: answered once the test opens the gate
		return reply{line: js(grant(11, 2, 4096, 4096)), fds: []int{m.make(data, 4096)}}
	})
	a, err := Open(f.path("a"))
	if err != nil {
		t.Fatal(err)
	}
	f.expect(proto.OpAcquire, 0)
	a.Close() // kept
	f.expect(proto.OpRelease, 10)
	type result struct {
		l   *Lease
		err error
	}
	done := make(chan result)
	go func() {
		l, err := Open(f.path("c"))
		done <- result{l, err}
	}()
	if r := f.expect(proto.OpAcquire, 0); r.Path != "c" {
		t.Fatalf("the busy request is for %q, want c", r.Path)
	}
	if _, err := Open(f.path("b")); !errors.Is(err, syscall.EMFILE) {
		t.Fatalf("a lease while the pool is busy, at the limit: %v, want EMFILE", err)
	}
	reg.mu.Lock()
	kept := reg.files[location{socket: f.sock, rel: "a"}.key()]
	reg.mu.Unlock()
	if kept != nil {
		t.Fatal("the kept mapping of a survived the refusal")
	}
	close(gate)
	c := <-done
	if c.err != nil {
		t.Fatal(c.err)
	}
	if d := <-f.drops; d.n != 0 || d.req.Generation != 1 || d.req.Device != "host" {
		t.Fatalf("dropped %+v on connection %d, want generation 1 on host on connection 0", d.req, d.n)
	}
	c.l.Close()
	f.expect(proto.OpRelease, 11)
	DropCache()
	f.closed(0)
	f.none()
	m.clean()
}
