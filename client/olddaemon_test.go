package client

import (
	"bytes"
	"testing"

	"github.com/gdsfs/gdsfs/proto"
)

// TestDaemonWithoutDrop: a daemon older than drop answers it as an
// unknown op. Once the client has read that answer, the connection takes
// no more fresh leases (the next goes on a new connection), and it
// closes once the client maps nothing from it.
func TestDaemonWithoutDrop(t *testing.T) {
	data := bytes.Repeat([]byte("d"), 4096)
	m := newMemfds(t)
	f := newScripted(t, func(n int, req proto.Request) reply {
		if req.Op == proto.OpRelease {
			return okAnswer()
		}
		return reply{line: js(grant(uint64(10+len(req.Path)), 1, 4096, 4096)), fds: []int{m.make(data, 4096)}}
	})
	f.noDrop.Store(true)
	a, err := Open(f.path("a"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := Open(f.path("bb"))
	if err != nil {
		t.Fatal(err)
	}
	a.Close()
	DropCache()                   // a unmapped: a drop the daemon does not know
	c, err := Open(f.path("ccc")) // reads that answer
	if err != nil {
		t.Fatal(err)
	}
	d, err := Open(f.path("dddd"))
	if err != nil {
		t.Fatal(err)
	}
	f.expectAll(seen{0, proto.Request{Op: proto.OpAcquire}}, seen{0, proto.Request{Op: proto.OpAcquire}},
		seen{0, proto.Request{Op: proto.OpRelease}}, seen{0, proto.Request{Op: proto.OpAcquire}}, seen{1, proto.Request{Op: proto.OpAcquire}})
	for _, l := range []*Lease{b, c, d} {
		l.Close()
	}
	DropCache()
	f.closed(0)
	f.closed(1)
}
