package client

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"syscall"
	"testing"

	"github.com/gdsfs/gdsfs/proto"
)

// TestErrorAnswers: a refusal is an error carrying the daemon's errno and
// text, and Open closes the connection it made for the lease (nothing is
// held there); an unknown errno name is EIO.
func TestErrorAnswers(t *testing.T) {
	for _, tc := range []struct {
		name string
		want syscall.Errno
	}{{"EACCES", syscall.EACCES}, {"ENOENT", syscall.ENOENT}, {"ETIMEDOUT", syscall.ETIMEDOUT}, {"EMFILE", syscall.EMFILE}, {"EBOGUS", syscall.EIO}} {
		t.Run(tc.name, func(t *testing.T) {
			f := newScripted(t, func(n int, req proto.Request) reply {
				return reply{line: js(map[string]any{"ok": false, "epoch": 1, "errno": tc.name, "error": "x: nope"})}
			})
			_, err := Open(f.path("a"))
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), "x: nope") {
				t.Fatalf("%v, want %v with the daemon's text", err, tc.want)
			}
			f.expect(proto.OpAcquire, 0)
			f.closed(0)
		})
	}
}

// TestRefusedBeforeRequest: a daemon at ipc.max_connections answers at
// once and hangs up; the client reports that answer, not a broken pipe.
func TestRefusedBeforeRequest(t *testing.T) {
	f := newScriptedAccept(t, func(int) reply {
		return reply{line: js(map[string]any{"ok": false, "errno": "EMFILE", "error": "more than ipc.max_connections (256) clients"}), hangup: true}
	}, nil)
	_, err := Open(f.path("a"))
	if !errors.Is(err, syscall.EMFILE) || !strings.Contains(err.Error(), "max_connections") {
		t.Fatalf("%v, want EMFILE naming max_connections", err)
	}
}

// TestReleaseAnsweredWithAnError: a release the daemon refuses for a
// reason other than a stale or unknown lease ends the connection, and the
// request that read that answer says so.
func TestReleaseAnsweredWithAnError(t *testing.T) {
	m := newMemfds(t)
	data := bytes.Repeat([]byte("r"), 10)
	f := newScripted(t, func(n int, req proto.Request) reply {
		switch req.Op {
		case proto.OpRelease:
			return reply{line: js(map[string]any{"ok": false, "epoch": 7, "errno": "EIO", "error": "release broke"})}
		case proto.OpStat:
			return reply{line: js(map[string]any{"ok": true, "epoch": 7, "size": 10, "state": "resident"})}
		}
		return reply{line: js(grant(3, 1, 10, 4096)), fds: []int{m.make(data, 4096)}}
	})
	c, err := Dial(f.sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	l, err := c.Acquire("a")
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	if _, err := c.Stat("a"); err == nil || !strings.Contains(err.Error(), "release answered: release broke") {
		t.Fatalf("stat after a refused release: %v, want the release's error", err)
	}
	f.expect(proto.OpAcquire, 0)
	f.expect(proto.OpRelease, 3)
	f.closed(0)
	if _, err := c.Stat("a"); !errors.Is(err, syscall.ENOTCONN) {
		t.Fatalf("the connection answered again: %v", err)
	}
	f.none()
	m.clean()
}

// TestReleaseOfAStaleLeaseIsNoError: ESTALE and EINVAL answers to a
// release (a lease of a daemon that restarted, or one already ended) are
// not errors; the connection goes on.
func TestReleaseOfAStaleLeaseIsNoError(t *testing.T) {
	for _, errno := range []string{"ESTALE", "EINVAL"} {
		t.Run(errno, func(t *testing.T) {
			m := newMemfds(t)
			f := newScripted(t, func(n int, req proto.Request) reply {
				switch req.Op {
				case proto.OpRelease:
					return reply{line: js(map[string]any{"ok": false, "epoch": 7, "errno": errno, "error": "gone"})}
				case proto.OpStat:
					return reply{line: js(map[string]any{"ok": true, "epoch": 7, "size": 10, "state": "resident"})}
				}
				return reply{line: js(grant(3, 1, 10, 4096)), fds: []int{m.make([]byte("0123456789"), 4096)}}
			})
			c, err := Dial(f.sock)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			l, err := c.Acquire("a")
			if err != nil {
				t.Fatal(err)
			}
			l.Close()
			if r, err := c.Stat("a"); err != nil || r.State != "resident" {
				t.Fatalf("stat after a release answered %s: %+v %v", errno, r, err)
			}
			m.clean()
		})
	}
}

// TestEmptyFile: a grant of size 0 still maps its chunk; the lease reads
// nothing, and a read past its end is an error.
func TestEmptyFile(t *testing.T) {
	m := newMemfds(t)
	f := newScripted(t, func(n int, req proto.Request) reply {
		g := grant(3, 1, 0, 4096)
		delete(g, "size") // the daemon omits it for an empty file
		return reply{line: js(g), fds: []int{m.make(nil, 4096)}}
	})
	l, err := Open(f.path("a"))
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 4)
	if n, err := l.ReadAt(b, 0); n != 0 || err != io.EOF || l.Size() != 0 {
		t.Fatalf("size %d, read %d %v; want 0 bytes and EOF", l.Size(), n, err)
	}
	if _, err := l.ReadAt(b, 1); err == nil || !strings.Contains(err.Error(), "read at 1: outside 0 bytes") {
		t.Fatalf("a read past the end: %v", err)
	}
	l.Close()
	DropCache()
	f.closed(0)
	m.clean()
}

// TestDaemonGoneBeforeClose: a lease whose daemon hung up closes without
// an error (the lease ended with the connection).
func TestDaemonGoneBeforeClose(t *testing.T) {
	m := newMemfds(t)
	f := newScripted(t, func(n int, req proto.Request) reply {
		r := reply{line: js(grant(3, 1, 5, 4096)), fds: []int{m.make([]byte("hello"), 4096)}, hangup: true}
		return r
	})
	l, err := Open(f.path("a"))
	if err != nil {
		t.Fatal(err)
	}
	f.closed(0)
	b := make([]byte, 5)
	if _, err := l.ReadAt(b, 0); err != nil || string(b) != "hello" {
		t.Fatalf("read %q %v", b, err)
	}
	if err := l.Close(); err != nil {
		t.Fatalf("close after the daemon left: %v", err)
	}
	DropCache()
	m.clean()
}
