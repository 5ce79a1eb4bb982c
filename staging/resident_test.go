package staging

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/gdsfs/gdsfs/internal/units"
)

// TestResidentAcquireLoadsAndJoinsNothing: an acquire asking for a
// resident file fails with ENODATA for a file staged nowhere (no load
// starts) and for one still loading (the load is not joined, nor waited
// for); once the file is resident the same request is granted.
func TestResidentAcquireLoadsAndJoinsNothing(t *testing.T) {
	src := t.TempDir()
	data := randomBytes(50000, 7)
	writeFile(t, src, "f", data)
	d := newFake(1 << 20)
	inCopy, release := make(chan struct{}, 1), make(chan struct{})
	d.copyHook = func() error {
		select {
		case inCopy <- struct{}{}:
		default:
		}
		<-release
		return nil
	}
	opts, io := testOptions()
	c := newCache(t, src, opts, io, d)
	ctx := context.Background()
	acquire := func() (*Lease, error) {
		f, err := os.Open(filepath.Join(src, "f"))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		return c.Acquire(ctx, Request{Rel: "f", File: f, Resident: true})
	}
	if l, err := acquire(); !errors.Is(err, syscall.ENODATA) {
		if l != nil {
			l.Release()
		}
		t.Fatalf("resident acquire of a file staged nowhere: %v; want ENODATA", err)
	}
	if state, _ := c.Attr("f"); state != StateAbsent || d.allocs.Load() != 0 {
		t.Fatalf("after a refused resident acquire: state %s, %d allocations; want absent, none", state, d.allocs.Load())
	}
	staged := make(chan error, 1)
	go func() { _, err := c.Stage(ctx, "f"); staged <- err }()
	<-inCopy // the load is in flight, held in its copy
	before := c.Stats()
	l, err := acquire()
	close(release)
	if !errors.Is(err, syscall.ENODATA) {
		if l != nil {
			l.Release()
		}
		t.Fatalf("resident acquire of a file loading: %v; want ENODATA", err)
	}
	if after := c.Stats(); after.SharedLoads != before.SharedLoads {
		t.Fatalf("the refused resident acquire joined the load (shared loads %d -> %d)", before.SharedLoads, after.SharedLoads)
	}
	if err := <-staged; err != nil {
		t.Fatal(err)
	}
	l, err = acquire()
	if err != nil {
		t.Fatalf("resident acquire of a resident file: %v", err)
	}
	defer l.Release()
	checkStaged(t, c, "f", data)
}

// TestRefusedResidentAcquireIsNoAccess: resident acquires answered
// ENODATA, in name order, tell read-ahead nothing: no file after them is
// staged.
func TestRefusedResidentAcquireIsNoAccess(t *testing.T) {
	c := raCache(t, nil, nil)
	for i := range 4 {
		f, err := os.Open(filepath.Join(c.root.Path(), raName(i)))
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.Acquire(context.Background(), Request{Rel: raName(i), File: f, Resident: true})
		f.Close()
		if !errors.Is(err, syscall.ENODATA) {
			t.Fatalf("resident acquire of %s, staged nowhere: %v; want ENODATA", raName(i), err)
		}
	}
	drain(c)
	if got := entryPaths(c); len(got) != 0 {
		t.Fatalf("after 4 refused resident acquires in name order, entries %v; want none (read-ahead staged after them)", got)
	}
}

// TestResidentAcquireMakesNoPrivateCopy: a resident acquire that asks for
// a private copy is refused (ENODATA): the copy would allocate, and evict
// another resident file to make room.
func TestResidentAcquireMakesNoPrivateCopy(t *testing.T) {
	src := t.TempDir()
	writeFile(t, src, "a", randomBytes(16<<10, 1))
	writeFile(t, src, "b", randomBytes(16<<10, 2))
	opts, io := testOptions()
	opts.Capacity = units.Share{Bytes: 32 << 10}
	d := newFake(16 << 10)
	c := newCache(t, src, opts, io, d)
	ctx := context.Background()
	for _, rel := range []string{"a", "b"} {
		if _, err := c.Stage(ctx, rel); err != nil {
			t.Fatal(err)
		}
	}
	allocs := d.allocs.Load()
	f, err := os.Open(filepath.Join(src, "a"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	l, err := c.Acquire(ctx, Request{Rel: "a", File: f, Private: true, Resident: true})
	if err == nil {
		l.Release()
	}
	if !errors.Is(err, syscall.ENODATA) {
		t.Fatalf("resident acquire with a private copy: %v; want ENODATA", err)
	}
	if n := d.allocs.Load() - allocs; n != 0 {
		t.Fatalf("it allocated %d regions; want none", n)
	}
	if st, _ := c.Attr("b"); st != StateResident {
		t.Fatalf("b is %s after it; want resident (nothing evicted)", st)
	}
}
