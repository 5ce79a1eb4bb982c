package staging

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
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
