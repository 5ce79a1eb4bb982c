package staging

import (
	"context"
	"testing"

	"github.com/gdsfs/gdsfs/proto"
)

// The states print the protocol's words, and only the moves of the life
// in state.go are allowed.
func TestStateWordsAndMoves(t *testing.T) {
	words := map[state]string{stLoading: proto.StateLoading, stResident: proto.StateResident, stFailed: proto.StateFailed, stAbsent: proto.StateAbsent}
	for s, w := range words {
		if s.String() != w {
			t.Errorf("%d prints %q, want %q", s, s.String(), w)
		}
	}
	all := []state{stLoading, stResident, stFailed, stAbsent}
	for _, from := range all {
		for _, to := range all {
			e := &entry{rel: "f", state: from}
			panicked := func() (p bool) {
				defer func() { p = recover() != nil }()
				e.moveLocked(to)
				return false
			}()
			if panicked == moves[[2]state{from, to}] {
				t.Errorf("move %s -> %s: panicked %v, legal %v", from, to, panicked, moves[[2]state{from, to}])
			}
		}
	}
}

// Close takes every entry out of its slot's LRU with the entries.
func TestCloseEmptiesLRU(t *testing.T) {
	src := t.TempDir()
	writeFile(t, src, "f", randomBytes(10000, 1))
	opts, io := testOptions()
	c := newCache(t, src, opts, io)
	if _, err := c.Stage(context.Background(), "f"); err != nil {
		t.Fatal(err)
	}
	c.Close()
	for _, s := range c.slots {
		if n := s.lru.Len(); n != 0 {
			t.Errorf("%s: %d entries left in the LRU after Close", s.dev.Name(), n)
		}
	}
}

// In tests every unlock of Cache.mu checks the invariants: books left
// wrong under the lock panic at the unlock, not at the test's end.
func TestUnlockChecksInvariants(t *testing.T) {
	opts, io := testOptions()
	c := newCache(t, t.TempDir(), opts, io)
	s := c.slots[0]
	panicked := func() (p bool) {
		defer func() { p = recover() != nil }()
		c.lock()
		s.used = s.capacity + 1
		c.unlock()
		return false
	}()
	// The panic left Cache.mu held: put the books right and release it.
	s.used = 0
	if panicked {
		c.mu.Unlock()
	} else {
		t.Error("an unlock with a slot over its capacity did not panic")
	}
}
