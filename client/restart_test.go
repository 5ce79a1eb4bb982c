package client

import (
	"bytes"
	"testing"

	"github.com/gdsfs/gdsfs/proto"
)

// TestOpenManyAfterThePooledConnectionWasClosed: a pooled connection the
// daemon closed while the process kept a mapping on it (the daemon
// restarted) is found out by the next batch of fresh leases, which is
// then made on a new connection, as Open's fresh lease is: the batch
// does not fail.
func TestOpenManyAfterThePooledConnectionWasClosed(t *testing.T) {
	data := bytes.Repeat([]byte("r"), 4096)
	m := newMemfds(t)
	f := newScripted(t, func(n int, req proto.Request) reply {
		switch {
		case req.Op == proto.OpRelease:
			return reply{line: okAnswer().line, hangup: true} // then the daemon goes
		case req.Op == proto.OpAcquire:
			return reply{line: js(grant(10, 1, 4096, 4096)), fds: []int{m.make(data, 4096)}}
		}
		return reply{line: many(grant(11, 2, 4096, 4096)), fds: []int{m.make(data, 4096)}}
	})
	a, err := Open(f.path("a"))
	if err != nil {
		t.Fatal(err)
	}
	f.expect(proto.OpAcquire, 0)
	a.Close() // kept, on connection 0
	f.expect(proto.OpRelease, 10)
	f.closed(0) // the daemon closed it
	ls, err := OpenMany([]string{f.path("b")})
	if err != nil {
		t.Fatalf("a batch after the pooled connection was closed: %v", err)
	}
	for _, l := range ls {
		l.Close()
	}
}
