package client

import (
	"bytes"
	"slices"
	"testing"

	"github.com/gdsfs/gdsfs/proto"
)

// unmappable is a full grant the client cannot map: its size passes its
// chunks (the daemon's protocol error, or any mapping failure).
func unmappable(lease, gen uint64) map[string]any {
	return grant(lease, gen, 8192, 4096)
}

// dropsSeen lists the generations dropped so far on connection n (every
// drop sent before the request the fake read last).
func (s *scripted) dropsSeen(n int) []uint64 {
	var gens []uint64
	for {
		select {
		case d := <-s.drops:
			if d.n == n {
				gens = append(gens, d.req.Generation)
			}
		default:
			slices.Sort(gens)
			return gens
		}
	}
}

// TestRepeatDropsAGrantItCouldNotMap: a repeat lease (Open's, and
// OpenMany's) answered with a full grant (new bytes) that fails to map, on
// a pooled connection that stays open (it holds another mapping), is
// dropped on it as well as the old mapping: the daemon counts every full
// grant as one mapping.
func TestRepeatDropsAGrantItCouldNotMap(t *testing.T) {
	for _, tc := range []struct {
		name   string
		answer func(items ...map[string]any) []byte
		op     string
		open   func(path string) (*Lease, error)
	}{
		{"Open", func(items ...map[string]any) []byte { return js(items[0]) }, proto.OpAcquire, func(p string) (*Lease, error) { return Open(p) }},
		{"OpenMany", many, proto.OpAcquireMany, func(p string) (*Lease, error) {
			ls, err := OpenMany([]string{p})
			if err != nil {
				return nil, err
			}
			return ls[0], nil
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data := bytes.Repeat([]byte("r"), 4096)
			m := newMemfds(t)
			acquires := 0
			f := newScripted(t, func(n int, req proto.Request) reply {
				switch {
				case req.Op == proto.OpRelease:
					return okAnswer()
				case req.Path == "b":
					return reply{line: js(grant(20, 9, 4096, 4096)), fds: []int{m.make(data, 4096)}}
				}
				acquires++
				switch acquires {
				case 1:
					return reply{line: js(grant(10, 1, 4096, 4096)), fds: []int{m.make(data, 4096)}}
				case 2: // the repeat: new bytes, not mappable
					return reply{line: tc.answer(unmappable(11, 2)), fds: []int{m.make(data, 4096)}}
				}
				return reply{line: tc.answer(grant(12, 3, 4096, 4096)), fds: []int{m.make(data, 4096)}}
			})
			b, err := Open(f.path("b")) // keeps the pooled connection open
			if err != nil {
				t.Fatal(err)
			}
			a, err := Open(f.path("a"))
			if err != nil {
				t.Fatal(err)
			}
			a.Close() // kept
			again, err := tc.open(f.path("a"))
			if err != nil {
				t.Fatal(err)
			}
			for _, op := range []string{proto.OpAcquire, proto.OpAcquire, proto.OpRelease, tc.op, proto.OpRelease, tc.op} {
				if r := f.next(); r.req.Op != op || r.n != 0 {
					t.Fatalf("the client sent %+v on connection %d, want %s on 0", r.req, r.n, op)
				}
			}
			if got := f.dropsSeen(0); !slices.Equal(got, []uint64{1, 2}) {
				t.Fatalf("drops of generations %v on the pooled connection, want [1 2]: the old mapping and the grant that failed to map", got)
			}
			again.Close()
			b.Close()
			DropCache()
			f.closed(0)
			m.clean()
		})
	}
}

// TestRepeatManyRefusedGivesBackTheRest: a repeat acquire_many whose
// first item is refused (an error not worth a retry) gives back the
// items after it: a full grant among them is released and dropped, on a
// pooled connection that stays open.
func TestRepeatManyRefusedGivesBackTheRest(t *testing.T) {
	data := bytes.Repeat([]byte("r"), 4096)
	m := newMemfds(t)
	f := newScripted(t, func(n int, req proto.Request) reply {
		switch {
		case req.Op == proto.OpRelease:
			return okAnswer()
		case req.Op == proto.OpAcquireMany: // the repeat of a and c
			return reply{line: many(refused("EACCES"), grant(31, 5, 4096, 4096)), fds: []int{m.make(data, 4096)}}
		case req.Path == "b":
			return reply{line: js(grant(20, 9, 4096, 4096)), fds: []int{m.make(data, 4096)}}
		case req.Path == "a":
			return reply{line: js(grant(10, 1, 4096, 4096)), fds: []int{m.make(data, 4096)}}
		}
		return reply{line: js(grant(11, 2, 4096, 4096)), fds: []int{m.make(data, 4096)}}
	})
	b, err := Open(f.path("b"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"a", "c"} {
		l, err := Open(f.path(p))
		if err != nil {
			t.Fatal(err)
		}
		l.Close()
	}
	if _, err := OpenMany([]string{f.path("a"), f.path("c")}); err == nil {
		t.Fatal("OpenMany with a refused: no error")
	}
	b.Close() // sent after what OpenMany sent
	DropCache()
	for _, op := range []string{proto.OpAcquire, proto.OpAcquire, proto.OpRelease, proto.OpAcquire, proto.OpRelease, proto.OpAcquireMany, proto.OpRelease, proto.OpRelease} {
		if r := f.next(); r.req.Op != op || r.n != 0 {
			t.Fatalf("the client sent %+v on connection %d, want %s on 0", r.req, r.n, op)
		}
	}
	f.closed(0)
	if got := f.dropsSeen(0); !slices.Contains(got, 5) {
		t.Fatalf("drops of generations %v on the pooled connection: none of the full grant (5) given back", got)
	}
	m.clean()
}
