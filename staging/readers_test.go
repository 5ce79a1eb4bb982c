package staging

import (
	"context"
	"testing"
	"time"
)

// TestStagedAfterReadersClose (issue 14): a file opened for reading
// through the mount is staged after its last reader closes it, not while
// it is read; a lease asks and is served at once; a prefetch of another
// file (read-ahead) is not held back; staging.defer_limit stages a file
// held open too long.
func TestStagedAfterReadersClose(t *testing.T) {
	src := t.TempDir()
	for _, name := range []string{"f", "g", "h", "slow"} {
		writeFile(t, src, name, randomBytes(50000, uint64(name[0])))
	}
	opts, io := testOptions()
	c := newCache(t, src, opts, io)
	rec := record(t, c)

	c.Opened("f")
	c.Opened("f") // two readers
	c.Closed("f")
	if s := c.Stats(); s.Prefetches != 0 || s.Misses != 0 || s.ReadersOpen != 1 || s.DeferredOpens != 2 {
		t.Fatalf("staging started while f is read: %+v", s)
	}
	if state, _ := c.Attr("f"); state != StateAbsent {
		t.Fatalf("f is %s while read", state)
	}
	if !c.Prefetch("g") { // read-ahead of another file
		t.Fatal("prefetch of g refused")
	}
	rec.waitFor(t, "g", StateResident)
	c.Closed("f") // the last reader: staging follows
	rec.waitFor(t, "f", StateResident)
	if s := c.Stats(); s.ReadersOpen != 0 || s.Misses != 2 {
		t.Fatalf("after the last close: %+v", s)
	}

	c.Opened("h") // a lease of a file being read is served now
	l, err := c.Acquire(context.Background(), Request{Rel: "h"})
	if err != nil {
		t.Fatal(err)
	}
	l.Release()
	c.Closed("h") // staged already: a hit
	if s := c.Stats(); s.Misses != 3 {
		t.Fatalf("loads %d, want 3", s.Misses)
	}
}

// TestDeferLimit: a file held open past staging.defer_limit is staged.
func TestDeferLimit(t *testing.T) {
	src := t.TempDir()
	writeFile(t, src, "f", randomBytes(50000, 1))
	opts, io := testOptions()
	opts.DeferLimit = time.Millisecond
	c := newCache(t, src, opts, io)
	rec := record(t, c)
	c.Opened("f")
	rec.waitFor(t, "f", StateResident) // no Closed came
	c.Closed("f")
	if s := c.Stats(); s.Misses != 1 || s.Prefetches != 1 {
		t.Fatalf("loads %d, prefetches %d: want 1 and 1", s.Misses, s.Prefetches)
	}
}

// TestNoDeferral: staging.defer_while_read=false stages at open.
func TestNoDeferral(t *testing.T) {
	src := t.TempDir()
	writeFile(t, src, "f", randomBytes(50000, 1))
	opts, io := testOptions()
	opts.DeferWhileRead = false
	c := newCache(t, src, opts, io)
	rec := record(t, c)
	c.Opened("f")
	rec.waitFor(t, "f", StateResident)
	if s := c.Stats(); s.DeferredOpens != 0 {
		t.Fatalf("deferred %d", s.DeferredOpens)
	}
}
