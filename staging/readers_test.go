package staging

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/staging/triggers"
)

// TestStagedAfterReadersClose: a file opened for reading
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

// TestStagingAfterReadYieldsToANewReader: the staging that
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

// oneWorkerCache is a cache of one prefetch worker and no
// staging.defer_limit; ar, when set, is its staging after reads.
func oneWorkerCache(t *testing.T, ar func(Options) *triggers.AfterRead) *Cache {
	src := t.TempDir()
	writeFile(t, src, "blocker", randomBytes(50000, 1))
	writeFile(t, src, "f", randomBytes(50000, 2))
	opts, io := testOptions()
	opts.RacyWindow, opts.PrefetchWorkers, opts.DeferLimit = 0, 1, 0
	cfg := Config{Source: src, Options: opts, IO: io}
	if ar != nil {
		cfg.AfterRead = ar(opts)
	}
	return newCacheCfg(t, cfg)
}

// TestPrefetchIsNotMergedIntoStagingAfterRead: a prefetch (warmup,
// .gdsfs/prefetch) of a file whose staging after a read is queued is its
// own request: it stages the file although a reader has it open (it was
// merged into the yielding one, which a reader holds back).
func TestPrefetchIsNotMergedIntoStagingAfterRead(t *testing.T) {
	c := oneWorkerCache(t, nil)
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
	// What the latest staging.defer_limit timer does when it fires. The
	// hook runs under AfterRead.mu: it only stores, it never blocks.
	var latest atomic.Pointer[func()]
	c := oneWorkerCache(t, func(opts Options) *triggers.AfterRead {
		return newAfterRead(opts, func(o *triggers.AfterReadOptions) {
			o.DeferLimit = time.Hour // never fires by itself: the test fires it
			o.AfterFunc = func(_ string, _ time.Duration, f func()) func() bool {
				latest.Store(&f)
				return func() bool { return true }
			}
		})
	})
	rec := record(t, c)
	release, _ := blockPrefetchWorker(t, c)
	c.Prefetch("blocker")
	c.Opened("f")
	c.Closed("f")
	c.Opened("f") // held open past staging.defer_limit:
	fire := latest.Load()
	if fire == nil {
		t.Fatal("no staging.defer_limit timer started")
	}
	(*fire)() // what the timer of the open that holds it does
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

// settleHooks scripts the page cache of settling files: each check of a
// file's page cache takes the next count sent on counts (a count of 16 or
// more is the whole file), and each wait before a check hands the test
// the channel that ends it (ticks). ctx ends the waits for a tick.
func settleHooks(t *testing.T, o *triggers.AfterReadOptions, ctx func() context.Context) (counts chan int64, ticks chan chan time.Time) {
	counts, ticks = make(chan int64), make(chan chan time.Time)
	o.PageCache = func(string) (int64, bool) {
		select {
		case n := <-counts:
			return n, n >= 16
		case <-time.After(20 * time.Second):
			t.Error("no page cache count scripted")
			return 0, true
		}
	}
	o.SettleTick = func(string) <-chan time.Time {
		tc := make(chan time.Time, 1)
		select {
		case ticks <- tc:
		case <-ctx().Done():
		}
		return tc
	}
	return counts, ticks
}

// settleCache is a cache over a SOURCE of 50,000-byte files named names,
// with settleHooks installed and its events recorded; edit, when set,
// changes the staging after reads' options after that.
func settleCache(t *testing.T, edit func(*triggers.AfterReadOptions), names ...string) (c *Cache, src string, rec *recorder, counts chan int64, ticks chan chan time.Time) {
	t.Helper()
	src = t.TempDir()
	for i, name := range names {
		writeFile(t, src, name, randomBytes(50000, uint64(i+1)))
	}
	opts, io := testOptions()
	ar := newAfterRead(opts, func(o *triggers.AfterReadOptions) {
		counts, ticks = settleHooks(t, o, func() context.Context { return c.ctx })
		if edit != nil {
			edit(o)
		}
	})
	c = newCacheCfg(t, Config{Source: src, Options: opts, IO: io, AfterRead: ar})
	rec = record(t, c)
	return c, src, rec, counts, ticks
}

// settlingWaits is the number of settling waits c's staging after reads
// runs.
func settlingWaits(c *Cache) int { return c.afterRead.(*triggers.AfterRead).Settling() }

// nextCheck ends the settling wait's current sleep and answers its page
// cache check with n.
func nextCheck(t *testing.T, counts chan int64, ticks chan chan time.Time, n int64) {
	t.Helper()
	within(t, "the settling wait", func() {
		tc := <-ticks
		tc <- time.Time{}
		counts <- n
	})
}

// TestStagingAfterReadWaitsWhileThePageCacheGrows: safetensors opens a
// file, maps it, closes it and then reads the whole mapping; a staging
// queued by that close would read the disk beside the loader. The
// staging after the last close waits while the
// file's page cache grows, and starts once it has not grown for
// settleQuiet checks.
func TestStagingAfterReadWaitsWhileThePageCacheGrows(t *testing.T) {
	c, _, rec, counts, ticks := settleCache(t, nil, "f")

	c.Opened("f")
	closed := make(chan struct{})
	go func() { defer close(closed); c.Closed("f") }()
	within(t, "the check at the last close", func() { counts <- 1 }) // the header only: the reader maps the rest
	within(t, "Closed", func() { <-closed })
	for _, n := range []int64{5, 9, 9} { // grows, grows, quiet once
		nextCheck(t, counts, ticks, n)
	}
	var tc chan time.Time
	within(t, "the settling wait", func() { tc = <-ticks }) // it decided to wait again
	if state, _ := c.Attr("f"); state != StateAbsent {
		t.Fatalf("f is %s while its page cache grows", state)
	}
	if s := c.Stats(); s.Prefetches != 0 || s.Misses != 0 || s.MappedReadWaits != 1 {
		t.Fatalf("staging queued while the page cache grows: %+v", s)
	}
	tc <- time.Time{}
	within(t, "the last check", func() { counts <- 9 }) // quiet twice: staged
	rec.waitFor(t, "f", StateResident)
	if s := c.Stats(); s.Misses != 1 || s.MappedReadWaits != 1 {
		t.Fatalf("after the page cache settled: %+v", s)
	}
}

// TestStagingAfterReadOfACachedFileStartsAtOnce: a file wholly in the page
// cache at its last close is queued at once (staging reads it from there),
// and one that becomes whole while settling is queued at that check.
func TestStagingAfterReadOfACachedFileStartsAtOnce(t *testing.T) {
	c, _, rec, counts, ticks := settleCache(t, nil, "f", "g")

	c.Opened("f")
	go c.Closed("f")
	within(t, "the check at the last close", func() { counts <- 16 })
	rec.waitFor(t, "f", StateResident)

	c.Opened("g")
	go c.Closed("g")
	within(t, "the check at the last close", func() { counts <- 3 })
	nextCheck(t, counts, ticks, 16) // whole: no second quiet check
	rec.waitFor(t, "g", StateResident)
	if s := c.Stats(); s.MappedReadWaits != 1 || s.Misses != 2 {
		t.Fatalf("mapped_read_waits %d (want 1), loads %d (want 2)", s.MappedReadWaits, s.Misses)
	}
}

// TestReopenEndsTheSettlingWait: a reader opening the file again ends the
// wait; staging follows its own last close, once.
func TestReopenEndsTheSettlingWait(t *testing.T) {
	c, _, rec, counts, ticks := settleCache(t, nil, "f")

	c.Opened("f")
	go c.Closed("f")
	within(t, "the check at the last close", func() { counts <- 1 })
	within(t, "the settling wait", func() { <-ticks }) // waiting; never ended by a tick
	c.Opened("f")                                      // ends the wait
	n := settlingWaits(c)
	if n != 0 {
		t.Fatal("the settling wait outlived a new open")
	}
	go c.Closed("f")
	within(t, "the check at the new last close", func() { counts <- 16 })
	rec.waitFor(t, "f", StateResident)
	if s := c.Stats(); s.Misses != 1 || s.Prefetches != 1 {
		t.Fatalf("loads %d, prefetches %d: want 1 and 1", s.Misses, s.Prefetches)
	}
}

// TestStagingAfterReadWaitsForTheReadersMapping: a warm load_file through
// the mount maps the file, closes it and copies the mapping to the device;
// a staging queued by that close would run beside the copy. A file a
// reader still maps is staged after it unmaps it.
func TestStagingAfterReadWaitsForTheReadersMapping(t *testing.T) {
	c, src, rec, counts, ticks := settleCache(t, func(o *triggers.AfterReadOptions) { o.MapMin = 0 }, "f")
	unmap := mapFile(t, filepath.Join(src, "f"), 50000)

	c.OpenedBy("f", Reader{PID: uint32(unix.Gettid()), Size: 50000})
	go c.Closed("f")
	within(t, "the check at the last close", func() { counts <- 16 }) // whole, but mapped
	nextCheck(t, counts, ticks, 16)                                   // still mapped
	var tc chan time.Time
	within(t, "the settling wait", func() { tc = <-ticks })
	if state, _ := c.Attr("f"); state != StateAbsent {
		t.Fatalf("f is %s while its reader maps it", state)
	}
	if s := c.Stats(); s.Prefetches != 0 || s.MappedReadWaits != 1 {
		t.Fatalf("staging queued while the reader maps the file: %+v", s)
	}
	unmap()
	tc <- time.Time{}
	within(t, "the check after the unmap", func() { counts <- 16 })
	rec.waitFor(t, "f", StateResident)
}

// TestSettlingKeepsTheEarlierReaders: a reader that
// opens the file again ends the wait, but the process that mapped the
// file before is still watched after that reader's close.
func TestSettlingKeepsTheEarlierReaders(t *testing.T) {
	c, src, rec, counts, ticks := settleCache(t, func(o *triggers.AfterReadOptions) { o.MapMin = 0 }, "f")
	unmap := mapFile(t, filepath.Join(src, "f"), 50000)
	c.OpenedBy("f", Reader{PID: uint32(unix.Gettid()), Size: 50000}) // maps it
	c.Closed("f")
	within(t, "the first check", func() { counts <- 16 })
	within(t, "the settling wait", func() { <-ticks })
	c.OpenedBy("f", Reader{PID: 1, Size: 50000}) // another process reads it, and closes
	c.Closed("f")
	within(t, "the check after the second close", func() { counts <- 16 })
	var tc chan time.Time
	within(t, "the second settling wait", func() { tc = <-ticks })
	if state, _ := c.Attr("f"); state != StateAbsent {
		t.Fatalf("f is %s while the first reader maps it", state)
	}
	unmap()
	tc <- time.Time{}
	within(t, "the check after the unmap", func() { counts <- 16 })
	rec.waitFor(t, "f", StateResident)
}

// TestReopenBeforeTheFirstCheck: a reader opening the
// file while the first check after the last close runs leaves no wait and
// no staging behind; its own close stages the file, once.
func TestReopenBeforeTheFirstCheck(t *testing.T) {
	c, _, rec, counts, _ := settleCache(t, nil, "f")
	c.Opened("f")
	c.Closed("f") // the check waits for its count
	c.Opened("f")
	within(t, "the first check", func() { counts <- 16 })
	n := settlingWaits(c)
	if n != 0 {
		t.Fatalf("%d settling waits while f is open", n)
	}
	c.Closed("f")
	within(t, "the check after the last close", func() { counts <- 16 })
	rec.waitFor(t, "f", StateResident)
	if s := c.Stats(); s.Prefetches != 1 || s.YieldedToReaders != 0 {
		t.Fatalf("prefetches %d (want 1), yielded %d (want 0)", s.Prefetches, s.YieldedToReaders)
	}
}

// TestNoSettlingForAStagedFile: the close of a file
// already staged queues its (hit) staging at once, with no check.
func TestNoSettlingForAStagedFile(t *testing.T) {
	c, _, rec, _, _ := settleCache(t, func(o *triggers.AfterReadOptions) {
		o.PageCache = func(string) (int64, bool) {
			t.Error("the page cache of a staged file was checked")
			return 0, true
		}
	}, "f")
	if _, err := c.Stage(context.Background(), "f"); err != nil {
		t.Fatal(err)
	}
	rec.waitFor(t, "f", StateResident)
	for range 3 {
		c.Opened("f")
		c.Closed("f")
	}
	if s := c.Stats(); s.MappedReadWaits != 0 || s.Prefetches == 0 { // a close while one is queued adds none
		t.Fatalf("mapped_read_waits %d (want 0), prefetches %d (want some)", s.MappedReadWaits, s.Prefetches)
	}
}

// TestEvictCancelsTheStagingAfterARead: an
// explicit evict of a file whose staging waits for its readers (still
// open through the mount, or closed and still read through a mapping)
// answered ENOENT and left that staging to run, so the file was staged
// again after the evict. The evict now cancels it; a later read defers
// and stages as before, and a file with nothing staged or waiting is
// still ENOENT.
func TestEvictCancelsTheStagingAfterARead(t *testing.T) {
	c, _, rec, counts, ticks := settleCache(t, nil, "f", "g", "h")

	// f: closed, its reader still reading (the page cache grows).
	c.Opened("f")
	go c.Closed("f")
	within(t, "the check at the last close", func() { counts <- 1 })
	// The wait sleeps; its tick never comes, so only the evict can end it
	// (a tick would let it check once more and take the count below).
	within(t, "the settling wait", func() { <-ticks })
	if err := c.Evict("f"); err != nil {
		t.Fatalf("evict of f, waiting for its reader: %v", err)
	}

	// g: still open through the mount; evicted from every device by name.
	c.Opened("g")
	if err := c.EvictOn("g", []string{"all"}); err != nil {
		t.Fatalf("evict of g, open: %v", err)
	}
	c.Closed("g") // no wait starts: nothing asks for a page cache count
	waits := settlingWaits(c)
	if waits != 0 {
		t.Fatalf("%d settling waits after the evicts", waits)
	}
	if s := c.Stats(); s.Prefetches != 0 || s.Misses != 0 {
		t.Fatalf("staged after the evicts: %+v", s)
	}

	// Nothing staged or waiting: ENOENT as before.
	if err := c.Evict("h"); !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("evict of h, never read: %v, want ENOENT", err)
	}

	// A later read of f is deferred and staged after it, once.
	c.Opened("f")
	go c.Closed("f")
	within(t, "the check at the new last close", func() { counts <- 16 })
	rec.waitFor(t, "f", StateResident)
	if s := c.Stats(); s.Prefetches != 1 || s.Misses != 1 {
		t.Fatalf("after the later read: %+v, want 1 prefetch and 1 load", s)
	}
	if state, _ := c.Attr("g"); state != StateAbsent {
		t.Fatalf("g is %s after its evict and close", state)
	}
}
