package staging

import (
	"bytes"
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/gdsfs/gdsfs/gpu"
	"github.com/gdsfs/gdsfs/staging/triggers/readahead"
)

// copyLog records the tasks a device's workers start copying, in order,
// as the size of the region they fill and the task's index in it.
type copyLog struct {
	mu      sync.Mutex
	tasks   []taskAt
	started chan struct{} // a copy started (dropped beyond its buffer)
}

type taskAt struct {
	size int64
	i    int64
}

func logCopies(d *fakeDevice) *copyLog {
	l := &copyLog{started: make(chan struct{}, 256)}
	d.copyTo = func(dst gpu.Region, off int64) {
		l.mu.Lock()
		if off%raSize == 0 { // a task's first piece (tasks are raSize)
			l.tasks = append(l.tasks, taskAt{dst.Size(), off / raSize})
		}
		l.mu.Unlock()
		select {
		case l.started <- struct{}{}:
		default:
		}
	}
	return l
}

// snapshot is every event delivered so far.
func (r *recorder) snapshot() []Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.all)
}

// recv receives from ch; the deadline only turns a hang into a failure.
func recv[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(20 * time.Second):
		t.Fatalf("no %s", what)
		panic("unreachable")
	}
}

// waitUntil waits until ok holds for the events delivered so far. The
// deadline only turns a hang into a failure.
func (r *recorder) waitUntil(t *testing.T, ok func([]Event) bool) {
	t.Helper()
	timeout := time.After(20 * time.Second)
	for !ok(r.snapshot()) {
		select {
		case <-r.more:
		case <-timeout:
			t.Fatalf("events so far: %+v", r.snapshot())
		}
	}
}

func (l *copyLog) order() []taskAt {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.tasks)
}

// TestJumpCancelsReadAhead: when the reader jumps, read-ahead loads in
// flight are cancelled: they leave the cache at once ("read-ahead
// cancelled"), their tasks not started are never read, nothing of them is
// published, and their sizes count as wasted.
func TestJumpCancelsReadAhead(t *testing.T) {
	sizes := map[int]int{4: 8 * raSize, 5: 8 * raSize, 6: 8 * raSize, 7: 8 * raSize}
	c, d, release := blockingCache(t, sizes, 0, 4)
	copies := logCopies(d)
	rec := record(t, c)
	for i := range 4 {
		c.Opened(raName(i))
	}
	drain(c)
	for _, rel := range raNames(4, 8) {
		rec.waitFor(t, rel, StateLoading)
	}
	for range 4 {
		recv(t, copies.started, "copy started") // each worker holds a task
	}
	c.Opened(raName(30)) // a jump
	drain(c)
	for _, rel := range raNames(4, 8) {
		if e := rec.waitFor(t, rel, StateAbsent); e.Reason != "read-ahead cancelled" {
			t.Fatalf("%s absent for %q, want read-ahead cancelled", rel, e.Reason)
		}
	}
	if s := c.Stats(); s.Cancelled != 4 || s.WastedBytes != 4*8*raSize {
		t.Fatalf("cancelled %d wasted %d, want 4 and %d", s.Cancelled, s.WastedBytes, 4*8*raSize)
	}
	close(release)
	c.Close() // waits for the loads
	if n := len(copies.order()); n != 4 {
		t.Fatalf("%d tasks copied, want the 4 the workers held when the loads were cancelled (of 32)", n)
	}
	for _, e := range rec.snapshot() {
		if e.State == StateResident || e.State == StateFailed {
			t.Fatalf("a cancelled load published %s for %s", e.State, e.Rel)
		}
	}
	if s := c.Stats(); s.LoadErrors != 0 {
		t.Fatalf("%d load errors: a cancellation is not one", s.LoadErrors)
	}
}

// TestDemandJoinPromotesReadAhead: a lease that joins a read-ahead load
// in flight promotes it: a later cancellation leaves it alone, and the
// lease gets its bytes from that very load.
func TestDemandJoinPromotesReadAhead(t *testing.T) {
	c, _, release := blockingCache(t, nil, 0, 4)
	joined := make(chan string, 1)
	c.hooks.joined = func(rel string) { joined <- rel }
	rec := record(t, c)
	for i := range 4 {
		c.Opened(raName(i))
	}
	drain(c)
	gens := map[string]uint64{}
	for _, rel := range raNames(4, 8) {
		gens[rel] = rec.waitFor(t, rel, StateLoading).Generation
	}
	got := acquireAsync(c, context.Background(), raName(5))
	if rel := recv(t, joined, "join"); rel != raName(5) {
		t.Fatalf("%s joined, want %s", rel, raName(5))
	}
	carry(c, readahead.Plan{Cancel: raNames(4, 8)})
	for _, rel := range []string{raName(4), raName(6), raName(7)} {
		if e := rec.waitFor(t, rel, StateAbsent); e.Reason != "read-ahead cancelled" {
			t.Fatalf("%s absent for %q", rel, e.Reason)
		}
	}
	close(release)
	r := recv(t, got, "lease")
	if r.err != nil {
		t.Fatal(r.err)
	}
	defer r.l.Release()
	if r.l.Generation() != gens[raName(5)] {
		t.Fatalf("leased generation %d, want %d: the read-ahead load's", r.l.Generation(), gens[raName(5)])
	}
	if !bytes.Equal(regionBytes(t, r.l.Region()), randomBytes(raSize, 5)) {
		t.Fatal("leased bytes differ from the file")
	}
	for _, e := range rec.snapshot() {
		if e.Rel == raName(5) && e.State == StateAbsent {
			t.Fatalf("the joined load was dropped: %q", e.Reason)
		}
	}
}

// TestDemandOvertakesReadAhead: with one loader worker busy on a
// read-ahead load, a demand load's tasks all go before the read-ahead
// load's remaining ones.
func TestDemandOvertakesReadAhead(t *testing.T) {
	c, d, release := blockingCache(t, map[int]int{4: 8 * raSize}, 1, 1) // only d/f04 ahead
	writeFile(t, c.root.Path(), "x/demand", randomBytes(4*raSize, 1))
	copies := logCopies(d)
	queued := make(chan string, 4)
	c.hooks.queued = func(rel string, _ bool) { queued <- rel }
	rec := record(t, c)
	for i := range 4 {
		c.Opened(raName(i))
	}
	drain(c)
	recv(t, copies.started, "copy started") // the worker holds d/f04's first task
	done := make(chan error, 1)
	go func() { _, err := c.Stage(context.Background(), "x/demand"); done <- err }()
	for rel := recv(t, queued, "queued load"); rel != "x/demand"; rel = recv(t, queued, "queued load") {
	}
	close(release)
	if err := recv(t, done, "staging of x/demand"); err != nil {
		t.Fatal(err)
	}
	rec.waitFor(t, raName(4), StateResident)
	ra, demand := int64(8*raSize), int64(4*raSize)
	want := []taskAt{{ra, 0}, {demand, 0}, {demand, 1}, {demand, 2}, {demand, 3}}
	for i := range int64(7) {
		want = append(want, taskAt{ra, i + 1})
	}
	if got := copies.order(); !slices.Equal(got, want) {
		t.Fatalf("tasks copied in the order %v, want %v", got, want)
	}
}

// TestPromotedLoadOvertakesReadAhead: of two read-ahead loads waiting
// for the one worker, the one a lease joins goes first from then on.
func TestPromotedLoadOvertakesReadAhead(t *testing.T) {
	sizes := map[int]int{4: 8 * raSize, 5: 9 * raSize}
	c, d, release := blockingCache(t, sizes, 1, 2) // d/f04 and d/f05 ahead
	copies := logCopies(d)
	queued := make(chan string, 4)
	c.hooks.queued = func(rel string, _ bool) { queued <- rel }
	joined := make(chan string, 1)
	c.hooks.joined = func(rel string) { joined <- rel }
	rec := record(t, c)
	for i := range 4 {
		c.Opened(raName(i))
	}
	drain(c)
	recv(t, queued, "queued load")
	recv(t, queued, "queued load")
	recv(t, copies.started, "copy started")
	held := copies.order()[0].size // the load whose first task the worker holds
	heldTasks, other, otherTasks := int64(8), raName(5), int64(9)
	if held == 9*raSize {
		heldTasks, other, otherTasks = 9, raName(4), 8
	}
	got := acquireAsync(c, context.Background(), other)
	recv(t, joined, "join")
	close(release)
	r := recv(t, got, "lease")
	if r.err != nil {
		t.Fatal(r.err)
	}
	r.l.Release()
	rec.waitFor(t, raName(4), StateResident)
	rec.waitFor(t, raName(5), StateResident)
	want := []taskAt{{held, 0}}
	for i := range otherTasks {
		want = append(want, taskAt{otherTasks * raSize, i})
	}
	for i := int64(1); i < heldTasks; i++ {
		want = append(want, taskAt{held, i})
	}
	if got := copies.order(); !slices.Equal(got, want) {
		t.Fatalf("tasks copied in the order %v, want %v: the promoted load's first", got, want)
	}
}
