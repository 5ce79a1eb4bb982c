package staging

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"testing"

	"github.com/gdsfs/gdsfs/gpu"
)

// TestEventsFollowAnEntry: an entry's life is heard in order: loading,
// resident (with the load's path, size and duration), absent when it
// leaves; a failed load says why; cancel stops the calls.
func TestEventsFollowAnEntry(t *testing.T) {
	src := t.TempDir()
	writeFile(t, src, "a", randomBytes(70000, 1))
	writeFile(t, src, "b", randomBytes(100, 2))
	d := newFake(1 << 20)
	d.alloc = func(size int64) (gpu.Region, error) {
		if size == 100 {
			return nil, fmt.Errorf("no: %w", gpu.ErrOutOfMemory)
		}
		return d.Device.Alloc(size)
	}
	opts, io := testOptions()
	c := newCache(t, src, opts, io, d)
	first := record(t, c)
	rec := record(t, c)
	ctx := context.Background()
	if _, err := c.Stage(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if err := c.Evict("a"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Stage(ctx, "b"); !errors.Is(err, gpu.ErrOutOfMemory) {
		t.Fatalf("stage b: %v", err)
	}
	first.waitFor(t, "b", StateFailed)
	first.cancel()
	c.Stage(ctx, "a")
	rec.waitFor(t, "a", StateResident)
	rec.waitFor(t, "a", StateResident) // the second staging, heard by rec only

	first.mu.Lock()
	defer first.mu.Unlock()
	got := first.all
	var states []string
	for _, e := range got {
		states = append(states, e.Rel+":"+e.State)
	}
	want := "[a:loading a:resident a:absent b:loading b:failed]"
	if fmt.Sprint(states) != want {
		t.Fatalf("events %v, want %s", states, want)
	}
	res, fail := got[1], got[4]
	if res.LoadPath != PathHost || res.Bytes != 70000 || res.Duration <= 0 || res.Generation == 0 || res.Device != "host" {
		t.Fatalf("resident event %+v", res)
	}
	if got[2].Reason != "evicted on request" {
		t.Fatalf("absent event %+v", got[2])
	}
	if !errors.Is(fail.Err, gpu.ErrOutOfMemory) || fail.Bytes != 100 {
		t.Fatalf("failed event %+v", fail)
	}
}

// TestQueuedFileNotStagedIsHeard: a queued file reads as loading; when
// its staging fails before an entry is made (here: it does not exist),
// subscribers hear that it is absent, and why, so a waiter on it wakes.
func TestQueuedFileNotStagedIsHeard(t *testing.T) {
	opts, io := testOptions()
	c := newCache(t, t.TempDir(), opts, io)
	rec := record(t, c)
	if !c.Prefetch("missing") {
		t.Fatal("prefetch refused")
	}
	e := rec.waitFor(t, "missing", StateAbsent)
	if !errors.Is(e.Err, syscall.ENOENT) || e.Reason == "" {
		t.Fatalf("absent event %+v: want ENOENT and a reason", e)
	}
	if state, _ := c.Attr("missing"); state != StateAbsent {
		t.Fatalf("state %q after the event", state)
	}
}
