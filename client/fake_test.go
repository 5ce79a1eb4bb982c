package client

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/proto"
)

// scripted is a fake daemon whose answers a test writes, well-formed or
// not: handle answers each request of connection n (counted from 0 in
// the order the client connects).
type scripted struct {
	t      *testing.T
	root   string // paths the client sends are under it
	sock   string
	ln     *net.UnixListener
	handle func(n int, req proto.Request) reply
	greet  func(n int) reply // sent as connection n is accepted (nil: nothing)
	got    chan seen         // every request but drops, in order
	drops  chan seen         // the drops, answered by the fake itself
	// noDrop: the fake is a daemon older than drop: it answers drop as an
	// unknown op
	noDrop atomic.Bool

	mu    sync.Mutex // guards conns and ops
	conns []chan struct{}
	ops   map[int][]string // per connection, the ops read, drops too, in order
}

// reply is what the fake sends back: line as is, with fds attached;
// hangup closes the connection after it.
type reply struct {
	line   []byte
	fds    []int
	hangup bool
}

// seen is one request the fake read.
type seen struct {
	n   int
	req proto.Request
}

// newScripted starts a fake daemon and points the registry's lookups at
// it (GDSFS_SOCKET, its directory a gdsfs mount in the mount table the
// client reads); kept mappings are dropped before and after.
func newScripted(t *testing.T, handle func(n int, req proto.Request) reply) *scripted {
	return newScriptedAccept(t, nil, handle)
}

// newScriptedAccept is newScripted with a reply sent as each connection
// is accepted, before any request.
func newScriptedAccept(t *testing.T, accept func(n int) reply, handle func(n int, req proto.Request) reply) *scripted {
	dir, _ := filepath.EvalSymlinks(t.TempDir())
	s := &scripted{t: t, root: dir, sock: filepath.Join(dir, "fake.sock"), handle: handle, greet: accept, got: make(chan seen, 256), drops: make(chan seen, 256)}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: s.sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	s.ln = ln
	t.Setenv("GDSFS_SOCKET", s.sock)
	t.Cleanup(MountinfoForTest(fakeMount(dir)))
	t.Setenv("GDSFS_DEVICE", "none")
	DropCache()
	t.Cleanup(func() {
		DropCache()
		ln.Close()
	})
	go s.accept()
	return s
}

func (s *scripted) path(name string) string { return filepath.Join(s.root, name) }

func (s *scripted) accept() {
	for {
		c, err := s.ln.AcceptUnix()
		if err != nil {
			return
		}
		eof := make(chan struct{})
		s.mu.Lock()
		n := len(s.conns)
		s.conns = append(s.conns, eof)
		s.mu.Unlock()
		go s.serve(n, c, eof)
	}
}

// serve answers one connection until the client closes it.
func (s *scripted) serve(n int, c *net.UnixConn, eof chan struct{}) {
	defer close(eof)
	defer c.Close()
	if s.greet != nil {
		if a := s.greet(n); a.line != nil || a.hangup {
			proto.Send(c, a.line, a.fds)
			if a.hangup {
				return
			}
		}
	}
	r := proto.NewReader(c, 1<<20)
	for {
		line, fds, err := r.Next()
		proto.CloseFDs(fds)
		if err != nil {
			return
		}
		req, err := proto.DecodeRequest(line)
		if err != nil {
			s.t.Errorf("fake daemon: the client sent %q: %v", line, err)
			return
		}
		s.mu.Lock()
		if s.ops == nil {
			s.ops = map[int][]string{}
		}
		s.ops[n] = append(s.ops[n], req.Op)
		s.mu.Unlock()
		if req.Op == proto.OpDrop {
			s.drops <- seen{n, req}
			if s.noDrop.Load() {
				proto.Send(c, js(map[string]any{"ok": false, "epoch": 7, "errno": "EINVAL", "error": `unknown op "drop" (want one of [acquire acquire_many hello release report stat wait wait_stat])`}), nil)
				continue
			}
			proto.Send(c, js(map[string]any{"ok": true, "epoch": 7}), nil)
			continue
		}
		s.got <- seen{n, req}
		a := s.handle(n, req)
		if a.line != nil {
			proto.Send(c, a.line, a.fds) // a client may be gone (it never waits for a release's answer)
		}
		if a.hangup {
			return
		}
	}
}

// closed waits until the client has closed connection n.
func (s *scripted) closed(n int) {
	s.t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		s.mu.Lock()
		var eof chan struct{}
		if n < len(s.conns) {
			eof = s.conns[n]
		}
		s.mu.Unlock()
		if eof == nil {
			s.t.Fatalf("the client never made connection %d", n)
		}
		select {
		case <-eof:
			return
		case <-deadline:
			s.t.Fatalf("the client kept connection %d open (and what the daemon granted on it)", n)
		}
	}
}

// opsOn lists the ops read on connection n, in order.
func (s *scripted) opsOn(n int) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.ops[n]...)
}

// next returns the next request the fake read.
func (s *scripted) next() seen {
	s.t.Helper()
	select {
	case r := <-s.got:
		return r
	case <-time.After(10 * time.Second):
		s.t.Fatal("the client sent no further request")
		return seen{}
	}
}

// expect reads the next request and checks its op (and lease id, when
// not 0).
func (s *scripted) expect(op string, lease uint64) proto.Request {
	s.t.Helper()
	r := s.next()
	if r.req.Op != op || (lease != 0 && r.req.Lease != lease) {
		s.t.Fatalf("the client sent %+v on connection %d, want %s of lease %d", r.req, r.n, op, lease)
	}
	return r.req
}

// expectAll reads len(want) requests, which may come in any order (they
// are on different connections), and checks that they are want's: each
// names the connection, op and lease id (0: any).
func (s *scripted) expectAll(want ...seen) {
	s.t.Helper()
	var got []seen
	for range want {
		got = append(got, s.next())
	}
	for _, w := range want {
		found := false
		for i, g := range got {
			if g.n == w.n && g.req.Op == w.req.Op && (w.req.Lease == 0 || g.req.Lease == w.req.Lease) && g.req.Generation == w.req.Generation {
				got = append(got[:i], got[i+1:]...)
				found = true
				break
			}
		}
		if !found {
			s.t.Fatalf("no %s of lease %d (generation %d) on connection %d among the requests; the others: %+v", w.req.Op, w.req.Lease, w.req.Generation, w.n, got)
		}
	}
}

// none checks that no request is waiting unread (call it once the
// connections that could carry one are closed).
func (s *scripted) none() {
	s.t.Helper()
	select {
	case r := <-s.got:
		s.t.Errorf("unexpected request %+v on connection %d", r.req, r.n)
	default:
	}
}

// js is v as one answer line.
func js(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return append(b, '\n')
}

// grant is an OK acquire answer (or acquire_many item) of size bytes in
// chunks of the given lengths.
func grant(lease, gen uint64, size int64, chunks ...int64) map[string]any {
	g := map[string]any{"ok": true, "epoch": 7, "lease": lease, "generation": gen, "device": "host", "sharing": "shared", "size": size, "cache": true}
	var cs []map[string]any
	for _, n := range chunks {
		cs = append(cs, map[string]any{"len": n})
	}
	if cs != nil {
		g["chunks"] = cs
	}
	return g
}

// memfds makes the descriptors a fake sends, named after the test so
// that what is left of them in this process (descriptors, mappings) is
// found by name, whatever else runs. The test closes its own copies with
// drop before looking.
type memfds struct {
	t      *testing.T
	prefix string
	mu     sync.Mutex
	open   []int
	n      int
}

func newMemfds(t *testing.T) *memfds {
	m := &memfds{t: t, prefix: "gdsfs-pe-" + strings.ReplaceAll(t.Name(), "/", "_") + "-"}
	t.Cleanup(m.drop)
	return m
}

// make returns a memfd of size bytes starting with data.
func (m *memfds) make(data []byte, size int64) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.n++
	fd, err := unix.MemfdCreate(fmt.Sprintf("%s%d", m.prefix, m.n), unix.MFD_CLOEXEC)
	if err != nil {
		m.t.Fatal(err)
	}
	if err := unix.Ftruncate(fd, size); err != nil {
		m.t.Fatal(err)
	}
	if _, err := unix.Pwrite(fd, data, 0); err != nil {
		m.t.Fatal(err)
	}
	m.open = append(m.open, fd)
	return fd
}

// drop closes the test's own copies.
func (m *memfds) drop() {
	m.mu.Lock()
	defer m.mu.Unlock()
	proto.CloseFDs(m.open)
	m.open = nil
}

// left lists the descriptors and mappings of these memfds this process
// still holds, once drop has closed the test's copies.
func (m *memfds) left() []string {
	m.t.Helper()
	m.drop()
	var out []string
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		m.t.Fatal(err)
	}
	for _, e := range ents {
		if l, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && strings.Contains(l, "memfd:"+m.prefix) {
			out = append(out, "fd "+e.Name()+" "+l)
		}
	}
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		m.t.Fatal(err)
	}
	for _, l := range strings.Split(string(maps), "\n") {
		if strings.Contains(l, "memfd:"+m.prefix) {
			out = append(out, "mapping "+l)
		}
	}
	return out
}

// clean checks that nothing of the memfds is left.
func (m *memfds) clean() {
	m.t.Helper()
	if l := m.left(); len(l) > 0 {
		m.t.Errorf("left open or mapped:\n%s", strings.Join(l, "\n"))
	}
}
