package client

import (
	"bytes"
	"errors"
	"strings"
	"syscall"
	"testing"

	"github.com/gdsfs/gdsfs/proto"
)

// TestAcquireRefusesBrokenAnswers: an acquire answer that breaks the
// protocol, or whose descriptors cannot be mapped, is an error that says
// what is wrong; the descriptors that came with it are closed and nothing
// stays mapped. A broken answer closes the connection (ending whatever
// the daemon granted on it); a grant that could not be mapped is released
// and the connection goes on.
func TestAcquireRefusesBrokenAnswers(t *testing.T) {
	page := bytes.Repeat([]byte("p"), 4096)
	for _, tc := range []struct {
		name   string
		answer func(m *memfds) reply
		errno  syscall.Errno // 0: not an errno of the daemon's or the protocol's
		msg    string
		closed bool // else: the grant is released and the connection stays usable
	}{
		{"descriptors missing", func(m *memfds) reply {
			return reply{line: js(grant(3, 1, 5000, 4096, 4096)), fds: []int{m.make(page, 4096)}}
		}, syscall.EPROTO, "1 descriptors for 2 chunks", true},
		{"descriptors beyond the chunks", func(m *memfds) reply {
			return reply{line: js(grant(3, 1, 10, 4096)), fds: []int{m.make(page, 4096), m.make(page, 4096)}}
		}, syscall.EPROTO, "2 descriptors for 1 chunks", true},
		{"descriptors with an error answer", func(m *memfds) reply {
			return reply{line: js(map[string]any{"ok": false, "epoch": 7, "errno": "EACCES", "error": "x: nope"}), fds: []int{m.make(page, 4096)}}
		}, syscall.EPROTO, "1 descriptors for 0 chunks", true},
		{"not json", func(m *memfds) reply {
			return reply{line: []byte("not json\n"), fds: []int{m.make(page, 4096)}}
		}, syscall.EPROTO, "bad answer", true},
		{"empty chunk", func(m *memfds) reply {
			return reply{line: js(grant(3, 1, 0, 0))}
		}, syscall.EPROTO, "chunk 0 has length 0", true},
		{"negative size", func(m *memfds) reply {
			return reply{line: js(grant(3, 1, -1, 4096)), fds: []int{m.make(page, 4096)}}
		}, syscall.EPROTO, "size -1", true},
		{"closed mid-answer", func(m *memfds) reply {
			return reply{line: []byte(`{"ok":tr`), fds: []int{m.make(page, 4096)}, hangup: true}
		}, 0, "connection closed by the daemon", true},
		{"size beyond the chunks", func(m *memfds) reply {
			return reply{line: js(grant(3, 1, 8192, 4096)), fds: []int{m.make(page, 4096)}}
		}, syscall.EPROTO, "size 8192 outside chunks of 4096 bytes", false},
		{"no chunks", func(m *memfds) reply {
			return reply{line: js(grant(3, 1, 10))}
		}, syscall.EPROTO, "0 descriptors for 0 chunks", false},
		{"short descriptor", func(m *memfds) reply {
			return reply{line: js(grant(3, 1, 8192, 4096, 4096)), fds: []int{m.make(page, 4096), m.make(page[:100], 100)}}
		}, 0, "chunk 1: descriptor holds 100 bytes, want 4096", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newMemfds(t)
			f := newScripted(t, func(n int, req proto.Request) reply {
				switch req.Op {
				case proto.OpAcquire:
					return tc.answer(m)
				case proto.OpStat:
					return reply{line: js(map[string]any{"ok": true, "epoch": 7, "size": 10, "state": "absent"})}
				}
				return reply{line: js(map[string]any{"ok": true, "epoch": 7})}
			})
			c, err := Dial(f.sock)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			l, err := c.Acquire("a.bin")
			if err == nil {
				l.Close()
				t.Fatal("the broken answer was accepted")
			}
			if !strings.Contains(err.Error(), tc.msg) || !strings.Contains(err.Error(), "acquire") {
				t.Errorf("error %q does not say %q of the acquire", err, tc.msg)
			}
			if tc.errno != 0 && !errors.Is(err, tc.errno) {
				t.Errorf("error %v is not %v", err, tc.errno)
			}
			f.expect(proto.OpAcquire, 0)
			m.clean()
			if tc.closed {
				f.closed(0)
				if _, err := c.Stat("a.bin"); !errors.Is(err, syscall.ENOTCONN) {
					t.Errorf("the broken connection answered again: %v", err)
				}
				f.none()
				return
			}
			f.expect(proto.OpRelease, 3)
			if _, err := c.Stat("a.bin"); err != nil {
				t.Errorf("the connection broke with the unmappable grant: %v", err)
			}
			f.expect(proto.OpStat, 0)
		})
	}
}

// TestOpenReuseOfAnotherGeneration: a repeat lease answered "reuse" for a
// generation other than the one the client keeps mapped is not taken: the
// lease it granted is released, the kept mapping undone, and the file
// leased afresh, with its current bytes, on a new connection.
func TestOpenReuseOfAnotherGeneration(t *testing.T) {
	old, cur := bytes.Repeat([]byte("o"), 10), bytes.Repeat([]byte("n"), 10)
	m := newMemfds(t)
	f := newScripted(t, func(n int, req proto.Request) reply {
		switch {
		case req.Op == proto.OpRelease:
			return reply{line: js(map[string]any{"ok": true, "epoch": 7})}
		case n == 0 && req.Generation == 0:
			return reply{line: js(grant(3, 1, 10, 4096)), fds: []int{m.make(old, 4096)}}
		case n == 0:
			g := grant(4, 2, 10)
			g["reuse"] = true
			return reply{line: js(g)}
		}
		return reply{line: js(grant(5, 2, 10, 4096)), fds: []int{m.make(cur, 4096)}}
	})
	p := f.path("a.bin")
	l, err := Open(p)
	if err != nil {
		t.Fatal(err)
	}
	f.expect(proto.OpAcquire, 0)
	l.Close() // kept: the answer allowed it
	f.expect(proto.OpRelease, 3)
	l, err = Open(p)
	if err != nil {
		t.Fatal(err)
	}
	if r := f.expect(proto.OpAcquire, 0); r.Generation != 1 {
		t.Fatalf("the repeat lease asked for generation %d, want 1", r.Generation)
	}
	f.expectAll(seen{0, proto.Request{Op: proto.OpRelease, Lease: 4}}, seen{1, proto.Request{Op: proto.OpAcquire}})
	f.closed(0) // its only mapping was undone
	b := make([]byte, 10)
	if _, err := l.ReadAt(b, 0); err != nil || !bytes.Equal(b, cur) || l.Generation() != 2 || l.Reused() {
		t.Fatalf("lease of generation %d (reused %v): %q, %v; want generation 2's bytes %q", l.Generation(), l.Reused(), b, err, cur)
	}
	l.Close()
	DropCache()
	f.closed(1)
	m.clean()
}

// TestOpenRepeatWithBrokenAnswer: a repeat lease whose answer breaks the
// protocol ends that connection, and the file is leased afresh.
func TestOpenRepeatWithBrokenAnswer(t *testing.T) {
	data := bytes.Repeat([]byte("d"), 10)
	m := newMemfds(t)
	f := newScripted(t, func(n int, req proto.Request) reply {
		switch {
		case req.Op == proto.OpRelease:
			return reply{line: js(map[string]any{"ok": true, "epoch": 7})}
		case n == 0 && req.Generation != 0: // two chunks named, one sent
			return reply{line: js(grant(4, 2, 10, 4096, 4096)), fds: []int{m.make(data, 4096)}}
		}
		return reply{line: js(grant(uint64(3+2*n), 1, 10, 4096)), fds: []int{m.make(data, 4096)}}
	})
	p := f.path("a.bin")
	l, err := Open(p)
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	if l, err = Open(p); err != nil {
		t.Fatal(err)
	}
	f.expect(proto.OpAcquire, 0)
	f.expect(proto.OpRelease, 3)
	f.expect(proto.OpAcquire, 0)
	f.expectAll(seen{1, proto.Request{Op: proto.OpAcquire}})
	f.closed(0)
	l.Close()
	DropCache()
	f.closed(1)
	m.clean()
}

// TestOpenRepeatChangedFile: a repeat lease of a file that changed is
// answered with new descriptors on the same connection: the lease maps
// the new bytes and the old mapping is undone.
func TestOpenRepeatChangedFile(t *testing.T) {
	old, cur := bytes.Repeat([]byte("o"), 10), bytes.Repeat([]byte("n"), 10)
	m := newMemfds(t)
	f := newScripted(t, func(n int, req proto.Request) reply {
		switch {
		case req.Op == proto.OpRelease:
			return reply{line: js(map[string]any{"ok": true, "epoch": 7})}
		case req.Generation == 0:
			return reply{line: js(grant(3, 1, 10, 4096)), fds: []int{m.make(old, 4096)}}
		}
		return reply{line: js(grant(4, 2, 10, 4096)), fds: []int{m.make(cur, 4096)}}
	})
	p := f.path("a")
	l, err := Open(p)
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	if l, err = Open(p); err != nil {
		t.Fatal(err)
	}
	f.expect(proto.OpAcquire, 0)
	f.expect(proto.OpRelease, 3)
	if r := f.next(); r.n != 0 || r.req.Generation != 1 {
		t.Fatalf("the repeat lease: %+v on connection %d, want generation 1 on connection 0", r.req, r.n)
	}
	b := make([]byte, 10)
	if _, err := l.ReadAt(b, 0); err != nil || !bytes.Equal(b, cur) || l.Generation() != 2 || l.Reused() {
		t.Fatalf("generation %d reused %v: %q %v, want generation 2's bytes", l.Generation(), l.Reused(), b, err)
	}
	for _, s := range m.left() {
		if strings.Contains(s, m.prefix+"1 ") {
			t.Errorf("the old generation is still held: %s", s)
		}
	}
	l.Close()
	DropCache()
	f.closed(0)
	m.clean()
}
