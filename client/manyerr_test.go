package client

import (
	"bytes"
	"errors"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/gdsfs/gdsfs/proto"
)

// okAnswer is an answer with nothing in it but success.
func okAnswer() reply { return reply{line: js(map[string]any{"ok": true, "epoch": 7})} }

// many is an acquire_many answer of the given items.
func many(items ...map[string]any) []byte {
	return js(map[string]any{"ok": true, "epoch": 7, "files": items})
}

// refused is an acquire_many item the daemon refused.
func refused(errno string) map[string]any {
	return map[string]any{"ok": false, "errno": errno, "error": "x: " + errno}
}

// reused is an acquire_many item reusing generation gen.
func reused(lease, gen uint64) map[string]any {
	g := grant(lease, gen, 10)
	g["reuse"] = true
	return g
}

// TestOpenManyRefusesBrokenAnswers: a new connection's acquire_many
// answered with too few files, with a file refused, or with a file that
// cannot be mapped fails as a whole: the error names the file (or the
// count), the files granted are released and dropped, and none of the
// descriptors stays open or mapped. (A file leased before
// the failure is closed like any lease: its mapping may be kept for a
// repeat lease until DropCache.)
func TestOpenManyRefusesBrokenAnswers(t *testing.T) {
	page := bytes.Repeat([]byte("p"), 4096)
	for _, tc := range []struct {
		name     string
		answer   func(m *memfds) reply
		errno    syscall.Errno
		msg      string // "%s": the path of the file the error names
		released []uint64
	}{
		{"answers missing", func(m *memfds) reply {
			return reply{line: many(grant(10, 1, 10, 4096), grant(11, 1, 10, 4096)), fds: []int{m.make(page, 4096), m.make(page, 4096)}}
		}, syscall.EPROTO, "acquire_many: 2 answers for 3 files", []uint64{10, 11}},
		{"descriptors missing", func(m *memfds) reply {
			return reply{line: many(grant(10, 1, 10, 4096), grant(11, 1, 10, 4096), grant(12, 1, 10, 4096)), fds: []int{m.make(page, 4096)}}
		}, syscall.EPROTO, "1 descriptors for 3 chunks", nil},
		{"a file refused", func(m *memfds) reply {
			return reply{line: many(grant(10, 1, 10, 4096), refused("EACCES"), grant(12, 1, 10, 4096)), fds: []int{m.make(page, 4096), m.make(page, 4096)}}
		}, syscall.EACCES, "%s: x: EACCES", []uint64{12, 10}},
		{"a file unmappable", func(m *memfds) reply {
			return reply{line: many(grant(10, 1, 10, 4096), grant(11, 1, 10, 4096), grant(12, 1, 10, 4096)), fds: []int{m.make(page, 4096), m.make(page[:9], 9), m.make(page, 4096)}}
		}, 0, "gdsfs acquire %s: map: chunk 0: descriptor holds 9 bytes, want 4096", []uint64{11, 12, 10}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newMemfds(t)
			f := newScripted(t, func(n int, req proto.Request) reply {
				if req.Op == proto.OpRelease {
					return okAnswer()
				}
				return tc.answer(m)
			})
			paths := []string{f.path("a"), f.path("b"), f.path("c")}
			ls, err := OpenMany(paths)
			if err == nil {
				t.Fatalf("OpenMany took the broken answer: %v", ls)
			}
			msg := strings.Replace(tc.msg, "%s", paths[1], 1)
			if !strings.Contains(err.Error(), msg) {
				t.Errorf("error %q does not say %q", err, msg)
			}
			if tc.errno != 0 && !errors.Is(err, tc.errno) {
				t.Errorf("error %v is not %v", err, tc.errno)
			}
			f.expect(proto.OpAcquireMany, 0)
			for _, id := range tc.released {
				f.expect(proto.OpRelease, id)
			}
			DropCache()
			f.closed(0)
			f.none()
			m.clean()
		})
	}
}

// keptMany leases paths in one acquire_many on connection 0 and closes
// the leases, leaving their mappings kept for repeat leases (generation
// 1, leases 10, 11, ...), except the last keep ones, left open.
func keptMany(t *testing.T, f *scripted, paths []string, keep int) []*Lease {
	t.Helper()
	ls, err := OpenMany(paths)
	if err != nil {
		t.Fatal(err)
	}
	f.expect(proto.OpAcquireMany, 0)
	for i, l := range ls[:len(ls)-keep] {
		l.Close()
		f.expect(proto.OpRelease, uint64(10+i))
	}
	return ls[len(ls)-keep:]
}

// firstMany answers connection 0's first acquire_many: every file at
// generation 1, old bytes.
func firstMany(m *memfds, req proto.Request, data []byte) reply {
	var items []map[string]any
	var fds []int
	for i := range req.Paths {
		items = append(items, grant(uint64(10+i), 1, int64(len(data)), 4096))
		fds = append(fds, m.make(data, 4096))
	}
	return reply{line: many(items...), fds: fds}
}

// TestOpenManyReuseOfAnotherGeneration: in a repeat acquire_many, a file
// answered "reuse" for a generation other than the one kept is released
// and leased afresh (on the same connection, the one of the pool free);
// the others are reused.
func TestOpenManyReuseOfAnotherGeneration(t *testing.T) {
	old, cur := bytes.Repeat([]byte("o"), 10), bytes.Repeat([]byte("n"), 10)
	m := newMemfds(t)
	var fresh atomic.Int32
	f := newScripted(t, func(n int, req proto.Request) reply {
		switch {
		case req.Op == proto.OpRelease:
			return okAnswer()
		case req.Generations == nil && fresh.Add(1) == 1:
			return firstMany(m, req, old)
		case req.Generations != nil:
			return reply{line: many(reused(20, 1), reused(21, 5))}
		}
		return reply{line: many(grant(30, 2, 10, 4096)), fds: []int{m.make(cur, 4096)}}
	})
	paths := []string{f.path("a"), f.path("b")}
	keptMany(t, f, paths, 0)
	ls, err := OpenMany(paths)
	if err != nil {
		t.Fatal(err)
	}
	if r := f.expect(proto.OpAcquireMany, 0); len(r.Generations) != 2 || r.Generations[0] != 1 || r.Generations[1] != 1 {
		t.Fatalf("the repeat asked for generations %v, want [1 1]", r.Generations)
	}
	f.expectAll(seen{0, proto.Request{Op: proto.OpRelease, Lease: 21}}, seen{0, proto.Request{Op: proto.OpAcquireMany}})
	for i, want := range []struct {
		data   []byte
		gen    uint64
		reused bool
	}{{old, 1, true}, {cur, 2, false}} {
		b := make([]byte, 10)
		if _, err := ls[i].ReadAt(b, 0); err != nil || !bytes.Equal(b, want.data) || ls[i].Generation() != want.gen || ls[i].Reused() != want.reused {
			t.Errorf("%s: generation %d reused %v bytes %q (%v), want generation %d reused %v bytes %q",
				paths[i], ls[i].Generation(), ls[i].Reused(), b, err, want.gen, want.reused, want.data)
		}
	}
	for _, l := range ls {
		l.Close()
	}
	DropCache()
	f.closed(0)
	m.clean()
}

// TestOpenManyRepeatAnswerCount: a repeat acquire_many answered with too
// few files leases them all afresh; what the broken answer granted is
// released (the connection stays open: another lease holds it).
func TestOpenManyRepeatAnswerCount(t *testing.T) {
	data := bytes.Repeat([]byte("d"), 10)
	m := newMemfds(t)
	f := newScripted(t, func(n int, req proto.Request) reply {
		switch {
		case req.Op == proto.OpRelease:
			return okAnswer()
		case req.Generations != nil:
			return reply{line: many(reused(20, 1))}
		}
		return firstMany(m, req, data)
	})
	paths := []string{f.path("a"), f.path("b"), f.path("c")}
	open := keptMany(t, f, paths, 1)
	ls, err := OpenMany(paths[:2])
	if err != nil {
		t.Fatal(err)
	}
	f.expect(proto.OpAcquireMany, 0)
	f.expectAll(seen{0, proto.Request{Op: proto.OpRelease, Lease: 20}}, seen{0, proto.Request{Op: proto.OpAcquireMany}})
	for _, l := range append(ls, open...) {
		l.Close()
	}
	DropCache()
	f.closed(0)
	m.clean()
}

// TestOpenManyRepeatRefusedReleasesTheRest: a repeat acquire_many in
// which a file is refused fails with an error naming it; the files after
// it that the daemon granted are released, not left held on the
// connection (which stays open: another lease holds it).
func TestOpenManyRepeatRefusedReleasesTheRest(t *testing.T) {
	data := bytes.Repeat([]byte("d"), 10)
	m := newMemfds(t)
	f := newScripted(t, func(n int, req proto.Request) reply {
		switch {
		case req.Op == proto.OpRelease:
			return okAnswer()
		case req.Generations == nil:
			return firstMany(m, req, data)
		}
		return reply{line: many(refused("EACCES"), reused(21, 1))}
	})
	paths := []string{f.path("a"), f.path("b"), f.path("c")}
	open := keptMany(t, f, paths, 1)
	ls, err := OpenMany(paths[:2])
	if err == nil {
		t.Fatalf("OpenMany leased a refused file: %v", ls)
	}
	if !errors.Is(err, syscall.EACCES) || !strings.Contains(err.Error(), paths[0]) {
		t.Errorf("error %q: want EACCES naming %s", err, paths[0])
	}
	f.expect(proto.OpAcquireMany, 0)
	f.expect(proto.OpRelease, 21)
	open[0].Close()
	f.expect(proto.OpRelease, 12)
	DropCache()
	f.closed(0)
	f.none()
	m.clean()
}

// TestOpenManyRepeatChangedFiles: a repeat acquire_many in which one file
// changed (a new grant with descriptors) maps the new bytes on the same
// connection, and one answered ESTALE is leased afresh (on the same
// connection too, the one of the pool free). A changed file whose
// descriptors cannot be mapped has its grant released and is leased
// afresh too.
func TestOpenManyRepeatChangedFiles(t *testing.T) {
	old, cur := bytes.Repeat([]byte("o"), 10), bytes.Repeat([]byte("n"), 10)
	m := newMemfds(t)
	var short atomic.Bool
	var fresh atomic.Int32
	f := newScripted(t, func(n int, req proto.Request) reply {
		switch {
		case req.Op == proto.OpRelease:
			return okAnswer()
		case req.Generations == nil && fresh.Add(1) == 1:
			return firstMany(m, req, old)
		case req.Generations == nil:
			return reply{line: many(grant(30, 2, 10, 4096)), fds: []int{m.make(cur, 4096)}}
		case short.Load():
			return reply{line: many(grant(20, 2, 10, 4096)), fds: []int{m.make(cur[:3], 3)}}
		}
		return reply{line: many(grant(20, 2, 10, 4096), refused("ESTALE")), fds: []int{m.make(cur, 4096)}}
	})
	paths := []string{f.path("a"), f.path("b")}
	keptMany(t, f, paths, 0)
	ls, err := OpenMany(paths)
	if err != nil {
		t.Fatal(err)
	}
	f.expect(proto.OpAcquireMany, 0)
	f.expectAll(seen{0, proto.Request{Op: proto.OpAcquireMany}})
	for i, l := range ls {
		b := make([]byte, 10)
		if _, err := l.ReadAt(b, 0); err != nil || !bytes.Equal(b, cur) || l.Generation() != 2 || l.Reused() {
			t.Errorf("%s: generation %d reused %v bytes %q (%v), want generation 2's", paths[i], l.Generation(), l.Reused(), b, err)
		}
		l.Close()
	}
	f.expectAll(seen{0, proto.Request{Op: proto.OpRelease, Lease: 20}}, seen{0, proto.Request{Op: proto.OpRelease, Lease: 30}})

	short.Store(true) // a's kept mapping on connection 0 is leased again, and changed
	ls, err = OpenMany(paths[:1])
	if err != nil {
		t.Fatal(err)
	}
	f.expectAll(seen{0, proto.Request{Op: proto.OpAcquireMany}}, seen{0, proto.Request{Op: proto.OpRelease, Lease: 20}},
		seen{0, proto.Request{Op: proto.OpAcquireMany}})
	b := make([]byte, 10)
	if _, err := ls[0].ReadAt(b, 0); err != nil || !bytes.Equal(b, cur) {
		t.Errorf("the fresh lease after an unmappable changed file: %q %v", b, err)
	}
	ls[0].Close()
	DropCache()
	f.closed(0)
	m.clean()
}
