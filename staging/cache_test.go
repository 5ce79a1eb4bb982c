package staging

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gdsfs/gdsfs/gpu"
	"github.com/gdsfs/gdsfs/internal/units"
	"github.com/gdsfs/gdsfs/staging/triggers"
)

func TestStagedBytesEqualFile(t *testing.T) {
	src := t.TempDir()
	opts, io := testOptions()
	opts.ChunkSize = 256 << 10 // several chunks for the larger files
	c := newCache(t, src, opts, io)
	sizes := []int{0, 1, 4095, 4096, 64<<10 - 1, 64<<10 + 1, 1<<20 + 12345}
	for i, n := range sizes {
		data := randomBytes(n, uint64(i))
		rel := fmt.Sprintf("d/f%d", i)
		writeFile(t, src, rel, data)
		info, err := c.Stage(context.Background(), rel)
		if err != nil {
			t.Fatalf("stage %d bytes: %v", n, err)
		}
		if info.State != StateResident || info.LoadPath != PathHost || info.Size != int64(n) {
			t.Fatalf("info %+v", info)
		}
		checkStaged(t, c, rel, data)
		if state, path := c.Attr(rel); state != StateResident || path != PathHost {
			t.Fatalf("Attr = %s %s", state, path)
		}
	}
	var total uint64
	for _, n := range sizes {
		total += uint64(n)
	}
	if s := c.Stats(); s.BytesHost != total || s.StagedFiles != len(sizes) || s.Misses != uint64(len(sizes)) || s.BytesPOSIX != 0 {
		t.Fatalf("stats %+v, want %d host bytes in %d files", s, total, len(sizes))
	}
	if state, _ := c.Attr("never"); state != StateAbsent {
		t.Fatalf("Attr of an unstaged path = %s", state)
	}
}

func TestSingleFlight(t *testing.T) {
	src := t.TempDir()
	data := randomBytes(1<<20, 1)
	writeFile(t, src, "f", data)
	d := newFake(1 << 20)
	release := make(chan struct{})
	d.copyHook = func() error { <-release; return nil }
	opts, io := testOptions()
	c := newCache(t, src, opts, io, d)
	joined := make(chan string, 16)
	c.hooks.joined = func(rel string) { joined <- rel }
	rec := record(t, c)

	const n = 16
	errs := make(chan error, n)
	for range n {
		go func() {
			_, err := c.Stage(context.Background(), "f")
			errs <- err
		}()
	}
	// All callers are in: one started the load, the others joined it.
	rec.waitFor(t, "f", StateLoading)
	for range n - 1 {
		<-joined
	}
	close(release)
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if got := d.allocs.Load(); got != 1 {
		t.Fatalf("%d allocations for one file, want 1", got)
	}
	if s := c.Stats(); s.Misses != 1 || s.SharedLoads != n-1 {
		t.Fatalf("misses %d shared %d, want 1 and %d", s.Misses, s.SharedLoads, n-1)
	}
	checkStaged(t, c, "f", data)
}

// capacityFor sizes the cache for k files of n bytes each on 4 KiB granules.
func capacityFor(k, n int) units.Share {
	return units.Share{Bytes: units.Size(k * int(gpu.RoundUp(int64(n), 4096)))}
}

func TestEvictionIsLRU(t *testing.T) {
	src := t.TempDir()
	opts, io := testOptions()
	opts.Capacity = capacityFor(3, 10000)
	c := newCache(t, src, opts, io)
	for _, name := range []string{"a", "b", "c", "d"} {
		writeFile(t, src, name, randomBytes(10000, uint64(name[0])))
	}
	ctx := context.Background()
	for _, name := range []string{"a", "b", "c", "a"} { // a is used again: b is now least recent
		if _, err := c.Stage(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Stage(ctx, "d"); err != nil {
		t.Fatal(err)
	}
	if got := paths(c.Entries()); got != "a c d" {
		t.Fatalf("resident after eviction: %q, want \"a c d\"", got)
	}
	if s := c.Stats(); s.Evictions != 1 || s.UsedBytes > s.CapacityBytes {
		t.Fatalf("stats %+v", s)
	}
}

func paths(infos []Info) string {
	var out []byte
	for i, in := range infos {
		if i > 0 {
			out = append(out, ' ')
		}
		out = append(out, in.Path...)
	}
	return string(out)
}

func TestLeaseBlocksEviction(t *testing.T) {
	src := t.TempDir()
	opts, io := testOptions()
	opts.Capacity = capacityFor(2, 10000)
	c := newCache(t, src, opts, io)
	data := map[string][]byte{}
	for _, name := range []string{"a", "b", "c", "d"} {
		data[name] = randomBytes(10000, uint64(name[0]))
		writeFile(t, src, name, data[name])
	}
	ctx := context.Background()
	la, err := c.Acquire(ctx, Request{Rel: "a"})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"b", "c"} { // c must evict b, never the leased a
		if _, err := c.Stage(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
	if got := paths(c.Entries()); got != "a c" {
		t.Fatalf("resident %q, want \"a c\"", got)
	}
	if err := c.Evict("a"); !errors.Is(err, syscall.EBUSY) {
		t.Fatalf("evict of a leased file: %v, want EBUSY", err)
	}
	lc, err := c.Acquire(ctx, Request{Rel: "c"})
	if err != nil {
		t.Fatal(err)
	}
	// Everything is leased: no room before the deadline, and nothing
	// leased was touched.
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := c.Stage(short, "d"); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("stage with every entry leased: %v, want ENOSPC", err)
	}
	if !bytes.Equal(regionBytes(t, la.Region()), data["a"]) {
		t.Fatal("leased bytes changed")
	}
	la.Release()
	la.Release() // twice is harmless
	if _, err := c.Stage(ctx, "d"); err != nil {
		t.Fatalf("stage after release: %v", err)
	}
	if got := paths(c.Entries()); got != "c d" {
		t.Fatalf("resident %q, want \"c d\" (a evicted once released)", got)
	}
	lc.Release()
	if s := c.Stats(); s.LeasesActive != 0 || s.LeasesTotal != 2 {
		t.Fatalf("lease counters %+v", s)
	}
}

func TestInvalidationOnChange(t *testing.T) {
	src := t.TempDir()
	opts, io := testOptions()
	c := newCache(t, src, opts, io)
	ctx := context.Background()
	old := randomBytes(50000, 1)
	writeFile(t, src, "f", old)
	l, err := c.Acquire(ctx, Request{Rel: "f"})
	if err != nil {
		t.Fatal(err)
	}
	gen := l.Generation()

	fresh := randomBytes(50000, 2) // same size: only mtime/ctime tell
	writeFile(t, src, "f", fresh)
	if state, _ := c.Attr("f"); state != StateAbsent {
		t.Fatalf("state after change = %s, want absent", state)
	}
	l2, err := c.Acquire(ctx, Request{Rel: "f"})
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Release()
	if l2.Generation() == gen {
		t.Fatal("re-staged file kept its generation")
	}
	if !bytes.Equal(regionBytes(t, l2.Region()), fresh) {
		t.Fatal("new lease sees stale bytes")
	}
	if !bytes.Equal(regionBytes(t, l.Region()), old) {
		t.Fatal("the old lease's bytes changed under it")
	}
	usedWithBoth := c.Stats().UsedBytes
	l.Release()
	if s := c.Stats(); s.UsedBytes >= usedWithBoth || s.Invalidations != 1 {
		t.Fatalf("old copy not freed on release: used %d -> %d, invalidations %d", usedWithBoth, s.UsedBytes, s.Invalidations)
	}

	rec := record(t, c)
	os.Remove(filepath.Join(src, "f"))
	c.Opened("f")
	c.Closed("f") // the read is over: staging (and finding the file gone) follows
	if e := rec.waitFor(t, "f", StateAbsent); e.Reason != "gone" || len(c.Entries()) != 0 {
		t.Fatalf("vanished file: event %+v, entries %v", e, c.Entries())
	}
}

func TestTooLargeAndNotEligible(t *testing.T) {
	src := t.TempDir()
	opts, io := testOptions()
	opts.Capacity = units.Share{Bytes: 8192}
	opts.MinFileSize = 10
	opts.Exclude = []string{"*.tmp"}
	c := newCache(t, src, opts, io)
	writeFile(t, src, "big", make([]byte, 8193))
	writeFile(t, src, "tiny", []byte("x"))
	writeFile(t, src, "x.tmp", make([]byte, 100))
	os.Mkdir(filepath.Join(src, "dir"), 0o755)
	os.Symlink("/etc/passwd", filepath.Join(src, "escape"))
	ctx := context.Background()
	for _, tc := range []struct {
		rel  string
		want error
	}{
		{"big", syscall.EFBIG}, {"tiny", syscall.EINVAL}, {"x.tmp", syscall.EINVAL},
		{"dir", syscall.EINVAL}, {"missing", syscall.ENOENT}, {"escape", syscall.EXDEV},
		{"../etc/passwd", syscall.ENOENT}, // cleaned: etc/passwd beneath SOURCE
	} {
		if _, err := c.Stage(ctx, tc.rel); !errors.Is(err, tc.want) {
			t.Errorf("stage %s: %v, want %v", tc.rel, err, tc.want)
		}
	}
	if s := c.Stats(); s.TooLarge != 1 || s.StagedFiles != 0 || s.UsedBytes != 0 {
		t.Fatalf("stats %+v", s)
	}
}

func TestFailedLoadIsRetried(t *testing.T) {
	src := t.TempDir()
	data := randomBytes(200000, 3)
	writeFile(t, src, "f", data)
	d := newFake(1 << 20)
	fail := true
	var mu sync.Mutex
	d.alloc = func(size int64) (gpu.Region, error) {
		mu.Lock()
		defer mu.Unlock()
		if fail {
			return nil, fmt.Errorf("alloc: %w", gpu.ErrOutOfMemory)
		}
		return d.Device.Alloc(size)
	}
	opts, io := testOptions()
	c := newCache(t, src, opts, io, d)
	ctx := context.Background()
	if _, err := c.Stage(ctx, "f"); !errors.Is(err, gpu.ErrOutOfMemory) {
		t.Fatalf("stage with no device memory: %v", err)
	}
	state, _ := c.Attr("f")
	if state != "failed: alloc: out of device memory" {
		t.Fatalf("state %q", state)
	}
	if s := c.Stats(); s.LoadErrors != 1 || s.UsedBytes != 0 || s.FailedFiles != 1 {
		t.Fatalf("stats after failure %+v", s)
	}
	mu.Lock()
	fail = false
	mu.Unlock()
	if _, err := c.Stage(ctx, "f"); err != nil {
		t.Fatalf("retry: %v", err)
	}
	checkStaged(t, c, "f", data)
}

func TestCopyErrorFailsLoad(t *testing.T) {
	src := t.TempDir()
	writeFile(t, src, "f", randomBytes(300000, 4))
	d := newFake(1 << 20)
	d.copyHook = func() error { return errors.New("copy engine on fire") }
	opts, io := testOptions()
	c := newCache(t, src, opts, io, d)
	if _, err := c.Stage(context.Background(), "f"); err == nil || !bytes.Contains([]byte(err.Error()), []byte("copy engine on fire")) {
		t.Fatalf("stage: %v", err)
	}
	if s := c.Stats(); s.UsedBytes != 0 || s.StagedFiles != 0 {
		t.Fatalf("a failed load holds space: %+v", s)
	}
}

func TestConcurrentPrefetchManyFiles(t *testing.T) {
	src := t.TempDir()
	opts, io := testOptions()
	opts.Capacity = capacityFor(40, 20000) // room for 40 of the 200
	opts.PrefetchQueue = 1000
	opts.PrefetchWorkers = 4
	c := newCache(t, src, opts, io)
	done := make(chan string, 2000)
	c.hooks.prefetchDone = func(rel string) { done <- rel }
	files := map[string][]byte{}
	for i := range 200 {
		rel := fmt.Sprintf("s%03d", i)
		files[rel] = randomBytes(10000+i*50, uint64(i))
		writeFile(t, src, rel, files[rel])
	}
	stop := make(chan struct{})
	checked := make(chan int)
	go func() { // check the invariants while the cache churns
		n := 0
		for {
			select {
			case <-stop:
				checked <- n
				return
			default:
			}
			c.lock()
			c.checkInvariantsLocked()
			c.unlock()
			n++
		}
	}()
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				c.Prefetch(fmt.Sprintf("s%03d", (i*7+g*13)%200))
			}
		}()
	}
	wg.Wait()
	for range c.Stats().Prefetches { // every queued path taken and finished
		<-done
	}
	close(stop)
	if n := <-checked; n == 0 {
		t.Fatal("invariants never checked")
	}
	s := c.Stats()
	if s.StagedFiles == 0 || s.UsedBytes > s.CapacityBytes || s.Evictions == 0 {
		t.Fatalf("stats %+v", s)
	}
	for _, in := range c.Entries() {
		if in.State == StateResident {
			checkStaged(t, c, in.Path, files[in.Path])
		}
	}
}

func TestPrefetchQueueDropsWhenFull(t *testing.T) {
	src := t.TempDir()
	d := newFake(1 << 20)
	release := make(chan struct{})
	d.copyHook = func() error { <-release; return nil }
	opts, io := testOptions()
	opts.PrefetchQueue = 2
	opts.PrefetchWorkers = 1
	c := newCache(t, src, opts, io, d)
	rec := record(t, c)
	for i := range 5 {
		writeFile(t, src, fmt.Sprint(i), []byte("data"))
	}
	c.Prefetch("0")
	rec.waitFor(t, "0", StateLoading) // the worker took it: the queue is empty
	accepted := 0
	for i := 1; i < 5; i++ {
		if c.Prefetch(fmt.Sprint(i)) {
			accepted++
		}
	}
	if !c.Prefetch("1") { // a duplicate of a queued path is not a new request
		t.Fatal("duplicate of a queued path refused")
	}
	close(release)
	if s := c.Stats(); accepted != 2 || s.PrefetchDropped != 2 || s.Prefetches != 3 {
		t.Fatalf("accepted %d, stats %+v: want 2 queued and 2 dropped", accepted, s)
	}
}

func TestEvictControl(t *testing.T) {
	src := t.TempDir()
	opts, io := testOptions()
	c := newCache(t, src, opts, io)
	writeFile(t, src, "f", []byte("hello"))
	if err := c.Evict("f"); !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("evict unstaged: %v", err)
	}
	c.Stage(context.Background(), "f")
	if err := c.Evict("f"); err != nil {
		t.Fatal(err)
	}
	if s := c.Stats(); s.StagedFiles != 0 || s.UsedBytes != 0 || s.Evictions != 1 {
		t.Fatalf("stats %+v", s)
	}
}

func TestAcquireTimeout(t *testing.T) {
	src := t.TempDir()
	writeFile(t, src, "f", randomBytes(100000, 9))
	d := newFake(1 << 20)
	release := make(chan struct{})
	d.copyHook = func() error { <-release; return nil }
	opts, io := testOptions()
	c := newCache(t, src, opts, io, d)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := c.Acquire(ctx, Request{Rel: "f"}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("acquire past its deadline: %v", err)
	}
	close(release)
}

// TestLateCopyErrorFailsLoad: a copy error that only Wait reports, on a
// task's first piece, fails the load even when the worker flushes both
// buffers at once (the last piece must be accounted last).
func TestLateCopyErrorFailsLoad(t *testing.T) {
	src := t.TempDir()
	writeFile(t, src, "f", randomBytes(32<<10, 15)) // one task, two 16 KiB pieces
	d := newFake(1 << 20)
	var once sync.Once
	d.waitHook = func(i int) error {
		var err error
		if i == 0 {
			once.Do(func() { err = errors.New("DMA fault on buffer 0") })
		}
		return err
	}
	opts, io := testOptions()
	io.NumThreads = 1
	c := newCache(t, src, opts, io, d)
	if _, err := c.Stage(context.Background(), "f"); err == nil || !strings.Contains(err.Error(), "DMA fault") {
		t.Fatalf("stage with a failed first piece: %v", err)
	}
}

// TestLeaseOfTheAskersFileOpensItOnce: a request that names the file it
// opened (Request.File) is served by the resident entry of exactly that
// file without the cache opening it again; a file changed since it was
// staged is staged afresh, and the lease is of the new bytes.
func TestLeaseOfTheAskersFileOpensItOnce(t *testing.T) {
	src := t.TempDir()
	opts, io := testOptions()
	c := newCache(t, src, opts, io)
	var opens atomic.Int32
	c.hooks.eligible = func(string) { opens.Add(1) }
	ctx := context.Background()
	old := randomBytes(50000, 1)
	writeFile(t, src, "f", old)
	if _, err := c.Stage(ctx, "f"); err != nil {
		t.Fatal(err)
	}
	staged := opens.Load()
	acquire := func() *Lease {
		t.Helper()
		f, err := os.Open(filepath.Join(src, "f"))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		l, err := c.Acquire(ctx, Request{Rel: "f", File: f})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	for range 3 {
		l := acquire()
		if !bytes.Equal(regionBytes(t, l.Region()), old) {
			t.Fatal("lease of the resident file: wrong bytes")
		}
		l.Release()
	}
	if n := opens.Load() - staged; n != 0 {
		t.Fatalf("3 leases of a resident file the askers opened: the cache opened it %d times, want 0", n)
	}
	if s := c.Stats(); s.Hits < 3 {
		t.Fatalf("hits %d, want >= 3", s.Hits)
	}

	fresh := randomBytes(50000, 2)
	writeFile(t, src, "f", fresh)
	changed(t, filepath.Join(src, "f"))
	l := acquire()
	defer l.Release()
	if !bytes.Equal(regionBytes(t, l.Region()), fresh) {
		t.Fatal("lease after a change: stale bytes")
	}
	if opens.Load() == staged {
		t.Fatal("a changed file was leased without the cache opening it to stage it again")
	}
}

// TestBackgroundLoadOfAStagedFileDoesNotOpenIt: read-ahead asking for a
// file that is resident and unchanged is answered Staged without the
// cache opening the file, with change events and with timestamps alone;
// once the file changed (and the change is known) it is loaded again.
func TestBackgroundLoadOfAStagedFileDoesNotOpenIt(t *testing.T) {
	for _, watch := range []string{WatchAuto, WatchTimestamps} {
		t.Run(watch, func(t *testing.T) {
			src, c := watchedCache(t, watch)
			var opens atomic.Int32
			c.hooks.eligible = func(string) { opens.Add(1) }
			ctx := context.Background()
			writeFile(t, src, "f", randomBytes(50000, 1))
			if _, err := c.Stage(ctx, "f"); err != nil {
				t.Fatal(err)
			}
			staged := opens.Load()
			if o := c.StartBackground(triggers.Background{Rel: "f", Reason: "read-ahead"}); o != triggers.Staged {
				t.Fatalf("background load of a resident file: %v, want Staged", o)
			}
			if n := opens.Load() - staged; n != 0 {
				t.Fatalf("background load of a resident file opened it %d times, want 0", n)
			}
			fresh := randomBytes(50000, 2)
			writeFile(t, src, "f", fresh)
			changed(t, filepath.Join(src, "f"))
			c.watch.drain() // as the next demand does: a change event drops the replica
			backgroundLoads(t, c, "f", fresh)
		})
	}
}

// watchedCache is a cache of a new SOURCE whose changes are detected
// as watch says (WatchAuto: by events, which the test needs), with no
// racy window.
func watchedCache(t *testing.T, watch string) (string, *Cache) {
	t.Helper()
	src := t.TempDir()
	opts, io := testOptions()
	opts.Watch, opts.RacyWindow = watch, 0
	c := newCache(t, src, opts, io)
	if watch == WatchAuto {
		needEvents(t, c)
	}
	return src, c
}

// backgroundLoads checks that a background load of rel starts (the
// file changed since it was staged) and stages want.
func backgroundLoads(t *testing.T, c *Cache, rel string, want []byte) {
	t.Helper()
	if o := c.StartBackground(triggers.Background{Rel: rel, Reason: "read-ahead"}); o != triggers.Started {
		t.Fatalf("background load of %s, changed since it was staged: %v, want Started", rel, o)
	}
	info, err := c.Stage(context.Background(), rel)
	if err != nil {
		t.Fatal(err)
	}
	if info.State != StateResident {
		t.Fatalf("%s after the background load: %s", rel, info.State)
	}
	checkStaged(t, c, rel, want)
}

// changed gives path an mtime an hour back, so its identity differs from
// before its last write even where timestamps are coarser than the test.
func changed(t *testing.T, path string) {
	t.Helper()
	when := time.Now().Add(-time.Hour)
	if err := os.Chtimes(path, when, when); err != nil {
		t.Fatal(err)
	}
}

// TestBackgroundLoadOfAReplacedFileLoadsIt: a file replaced by another
// (a new file renamed over it, as checkpoints are written) raises no
// change event about the staged inode, so read-ahead must look at the
// file: it loads the new one.
func TestBackgroundLoadOfAReplacedFileLoadsIt(t *testing.T) {
	for _, watch := range []string{WatchAuto, WatchTimestamps} {
		t.Run(watch, func(t *testing.T) {
			src, c := watchedCache(t, watch)
			ctx := context.Background()
			writeFile(t, src, "f", randomBytes(50000, 1))
			if _, err := c.Stage(ctx, "f"); err != nil {
				t.Fatal(err)
			}
			fresh := randomBytes(50000, 2)
			writeFile(t, src, "f.tmp", fresh)
			if err := os.Rename(filepath.Join(src, "f.tmp"), filepath.Join(src, "f")); err != nil {
				t.Fatal(err)
			}
			c.watch.drain() // every event there is has been handled
			backgroundLoads(t, c, "f", fresh)
		})
	}
}
