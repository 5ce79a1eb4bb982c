package staging

import (
	"context"
	"errors"
	"sync"
	"syscall"
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

// gatedCache is a cache over src whose device copies wait for release;
// started is closed at the first copy.
func gatedCache(t *testing.T, src string) (c *Cache, started, release chan struct{}) {
	t.Helper()
	d := newFake(1 << 20)
	started, release = make(chan struct{}), make(chan struct{})
	var once sync.Once
	d.copyHook = func() error {
		once.Do(func() { close(started) })
		<-release
		return nil
	}
	opts, io := testOptions()
	opts.RacyWindow = 0
	c = newCache(t, src, opts, io, d)
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	return c, started, release
}

// TestStagingAfterReadYieldsToANewReader (issue 14): the staging that
// follows a reader's close is cancelled when a reader opens the file
// through the mount again (a loader that reads a header, closes, and
// opens the file again to read the rest), so it does not read the disk
// alongside that reader; it is staged again after that reader closes.
func TestStagingAfterReadYieldsToANewReader(t *testing.T) {
	src := t.TempDir()
	writeFile(t, src, "f", randomBytes(300000, 7))
	c, started, release := gatedCache(t, src)
	rec := record(t, c)
	done := make(chan string, 4)
	c.hooks.prefetchDone = func(rel string) { done <- rel }
	c.Opened("f")
	c.Closed("f") // the reader is done: staging follows
	within(t, "the staging's first copy", func() { <-started })
	c.Opened("f") // a new reader: the staging yields
	if ev := rec.waitFor(t, "f", StateAbsent); ev.Reason != "yielded to a reader" {
		t.Fatalf("absent because %q, want yielded to a reader", ev.Reason)
	}
	close(release)
	if rel := <-done; rel != "f" {
		t.Fatalf("prefetch of %s ended", rel)
	}
	if state, _ := c.Attr("f"); state != StateAbsent {
		t.Fatalf("f is %s while the new reader has it open", state)
	}
	if s := c.Stats(); s.YieldedToReaders != 1 || s.LoadErrors != 0 {
		t.Fatalf("yielded %d, load errors %d: want 1 and 0", s.YieldedToReaders, s.LoadErrors)
	}
	c.Closed("f")
	rec.waitFor(t, "f", StateResident)
	if s := c.Stats(); s.Misses != 2 {
		t.Fatalf("loads %d, want 2 (the yielded one and the one after the last close)", s.Misses)
	}
}

// TestStagingJoinedByALeaseDoesNotYield: a lease that joins the staging
// after a read keeps it going, even when a reader opens the file again.
func TestStagingJoinedByALeaseDoesNotYield(t *testing.T) {
	src := t.TempDir()
	writeFile(t, src, "f", randomBytes(300000, 8))
	c, started, release := gatedCache(t, src)
	joined := make(chan struct{})
	c.hooks.joined = func(string) { close(joined) }
	c.Opened("f")
	c.Closed("f")
	within(t, "the staging's first copy", func() { <-started })
	leased := make(chan error, 1)
	go func() {
		l, err := c.Acquire(context.Background(), Request{Rel: "f"})
		if err == nil {
			l.Release()
		}
		leased <- err
	}()
	within(t, "the lease joining the load", func() { <-joined })
	c.Opened("f")
	close(release)
	if err := <-leased; err != nil {
		t.Fatalf("the lease: %v", err)
	}
	if s := c.Stats(); s.YieldedToReaders != 0 || s.Misses != 1 {
		t.Fatalf("yielded %d, loads %d: want 0 and 1", s.YieldedToReaders, s.Misses)
	}
	c.Closed("f")
}

// TestStagingAfterReadWaitsForANewReader: a staging after a read that
// has not begun when a reader opens the file again does not begin (the
// reader's open may reach the daemon before the previous reader's
// release: then nothing is queued; after it, the queued staging meets
// the new reader here).
func TestStagingAfterReadWaitsForANewReader(t *testing.T) {
	src := t.TempDir()
	writeFile(t, src, "f", randomBytes(300000, 9))
	opts, io := testOptions()
	opts.RacyWindow = 0
	c := newCache(t, src, opts, io)
	rec := record(t, c)
	c.Opened("f")
	if err := c.stageYielding(context.Background(), "f", c.ra.Tick()); !errors.Is(err, syscall.EAGAIN) {
		t.Fatalf("staging after a read with a reader in: %v, want EAGAIN (yielded)", err)
	}
	if s := c.Stats(); s.Misses != 0 || s.YieldedToReaders != 1 {
		t.Fatalf("loads %d, yielded %d: want 0 and 1", s.Misses, s.YieldedToReaders)
	}
	c.Closed("f")
	rec.waitFor(t, "f", StateResident)
}

// blockPrefetchWorker makes the one prefetch worker stop after staging
// "blocker" until release is closed; done hears every prefetch that ends.
func blockPrefetchWorker(t *testing.T, c *Cache) (release chan struct{}, done chan string) {
	release, done = make(chan struct{}), make(chan string, 16)
	c.hooks.prefetchDone = func(rel string) {
		if rel == "blocker" {
			<-release
		}
		done <- rel
	}
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	return release, done
}

func oneWorkerCache(t *testing.T) *Cache {
	src := t.TempDir()
	writeFile(t, src, "blocker", randomBytes(50000, 1))
	writeFile(t, src, "f", randomBytes(50000, 2))
	opts, io := testOptions()
	opts.RacyWindow, opts.PrefetchWorkers, opts.DeferLimit = 0, 1, 0
	return newCache(t, src, opts, io)
}

// TestPrefetchIsNotMergedIntoStagingAfterRead: a prefetch (warmup,
// .gdsfs/prefetch) of a file whose staging after a read is queued is its
// own request: it stages the file although a reader has it open (it was
// merged into the yielding one, which a reader holds back).
func TestPrefetchIsNotMergedIntoStagingAfterRead(t *testing.T) {
	c := oneWorkerCache(t)
	rec := record(t, c)
	release, _ := blockPrefetchWorker(t, c)
	c.Prefetch("blocker")
	c.Opened("f")
	c.Closed("f") // the staging after the read waits behind blocker
	c.Opened("f") // a new reader
	if !c.Prefetch("f") {
		t.Fatal("prefetch of f refused")
	}
	close(release)
	rec.waitFor(t, "f", StateResident)
	c.Closed("f")
}

// TestDeferLimitAfterAYieldedStaging: staging.defer_limit stages a file
// held open although the staging after an earlier read of it yielded (its
// prefetch was merged into that one, and the file was never staged).
func TestDeferLimitAfterAYieldedStaging(t *testing.T) {
	c := oneWorkerCache(t)
	rec := record(t, c)
	release, _ := blockPrefetchWorker(t, c)
	c.Prefetch("blocker")
	c.Opened("f")
	c.Closed("f")
	c.Opened("f") // held open past staging.defer_limit:
	c.mu.Lock()
	r := c.readers["f"]
	c.mu.Unlock()
	c.deferLimit("f", r) // what its timer does
	close(release)
	rec.waitFor(t, "f", StateResident)
	c.Closed("f")
}

// TestPrefetchJoinsAYieldingStaging: a prefetch made while the staging
// after a read loads joins it, so a reader opening the file then does not
// cancel it (the prefetch was dropped as a duplicate, and the file read
// absent after the reader's open).
func TestPrefetchJoinsAYieldingStaging(t *testing.T) {
	src := t.TempDir()
	writeFile(t, src, "f", randomBytes(300000, 3))
	c, started, release := gatedCache(t, src)
	rec := record(t, c)
	joined := make(chan struct{})
	var once sync.Once
	c.hooks.joined = func(string) { once.Do(func() { close(joined) }) }
	c.Opened("f")
	c.Closed("f")
	within(t, "the staging's first copy", func() { <-started })
	if !c.Prefetch("f") {
		t.Fatal("prefetch of f refused")
	}
	within(t, "the prefetch joining the staging", func() { <-joined })
	c.Opened("f")
	close(release)
	rec.waitFor(t, "f", StateResident)
	if s := c.Stats(); s.YieldedToReaders != 0 || s.Misses != 1 {
		t.Fatalf("yielded %d, loads %d: want 0 and 1", s.YieldedToReaders, s.Misses)
	}
	c.Closed("f")
}
