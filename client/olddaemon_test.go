package client

import (
	"bytes"
	"testing"

	"github.com/gdsfs/gdsfs/proto"
)

// TestDaemonWithoutDropHoldsNoUnmappedFile: a daemon older than drop
// ends what a connection holds only when it closes. A file the process
// unmapped must not stay held there because another file leased after it
// on the same connection is still in use: with such a daemon a fresh
// lease goes on a connection holding nothing else (as before drop), and
// the connection of the unmapped file closes.
func TestDaemonWithoutDropHoldsNoUnmappedFile(t *testing.T) {
	data := bytes.Repeat([]byte("d"), 4096)
	m := newMemfds(t)
	f := newScripted(t, func(n int, req proto.Request) reply {
		switch {
		case req.Op == proto.OpRelease:
			return okAnswer()
		case req.Op == proto.OpHello:
			return reply{line: js(map[string]any{"ok": true, "epoch": 7, "version": 1, "max_fds": 253,
				"ops": []string{"acquire", "acquire_many", "hello", "release", "report", "stat", "wait", "wait_stat"}})}
		case req.Path == "a":
			return reply{line: js(grant(10, 1, 4096, 4096)), fds: []int{m.make(data, 4096)}}
		}
		return reply{line: js(grant(11, 2, 4096, 4096)), fds: []int{m.make(data, 4096)}}
	})
	f.noDrop = true
	a, err := Open(f.path("a"))
	if err != nil {
		t.Fatal(err)
	}
	f.expect(proto.OpAcquire, 0)
	b, err := Open(f.path("b"))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	a.Close()   // kept
	DropCache() // a unmapped: its connection must close, b's lease stays
	f.closed(0)
	if _, err := b.ReadAt(make([]byte, 16), 0); err != nil {
		t.Fatalf("b after a was let go: %v", err)
	}
}
