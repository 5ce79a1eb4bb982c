package staging

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// needEvents fails the test unless c gets fanotify events for SOURCE.
func needEvents(t *testing.T, c *Cache) {
	t.Helper()
	if m := c.Stats().ChangeDetection; m != "fanotify" {
		t.Fatalf("this test needs fanotify on TMPDIR's filesystem (root, a local filesystem): %s", m)
	}
}

// TestChangedWhileLoadingIsRetried: a file rewritten while it loads is
// loaded again, and the lease has the new bytes (once it failed with EIO).
func TestChangedWhileLoadingIsRetried(t *testing.T) {
	for _, watch := range []string{WatchAuto, WatchTimestamps} {
		t.Run(watch, func(t *testing.T) {
			src := t.TempDir()
			writeFile(t, src, "f", randomBytes(300000, 5))
			fresh := randomBytes(300000, 6)
			d := newFake(1 << 20)
			var once sync.Once
			d.copyHook = func() error {
				once.Do(func() { // same size, new bytes, while the load runs
					os.WriteFile(filepath.Join(src, "f"), fresh, 0o644)
				})
				return nil
			}
			opts, io := testOptions()
			opts.Watch, opts.RacyWindow = watch, 0
			c := newCache(t, src, opts, io, d)
			if _, err := c.Stage(context.Background(), "f"); err != nil {
				t.Fatalf("stage of a file changing under the load: %v", err)
			}
			checkStaged(t, c, "f", fresh)
			if s := c.Stats(); s.LoadRetries != 1 || s.LoadErrors != 1 {
				t.Fatalf("retries %d, load errors %d: want 1 and 1", s.LoadRetries, s.LoadErrors)
			}
		})
	}
}

// TestKeepsChangingIsEAGAIN: a file that changes under every load is
// answered EAGAIN after maxAttempts loads, never EIO.
func TestKeepsChangingIsEAGAIN(t *testing.T) {
	src := t.TempDir()
	writeFile(t, src, "f", randomBytes(100000, 5))
	d := newFake(1 << 20)
	var mu sync.Mutex
	n := 0
	d.copyHook = func() error {
		mu.Lock()
		defer mu.Unlock()
		n++
		return os.WriteFile(filepath.Join(src, "f"), randomBytes(100000, uint64(n)), 0o644)
	}
	opts, io := testOptions()
	c := newCache(t, src, opts, io, d)
	_, err := c.Acquire(context.Background(), Request{Rel: "f"})
	if !errors.Is(err, syscall.EAGAIN) {
		t.Fatalf("acquire of a file that never holds still: %v, want EAGAIN", err)
	}
	if s := c.Stats(); s.Misses != maxAttempts || s.LoadRetries != maxAttempts-1 {
		t.Fatalf("misses %d, retries %d: want %d loads", s.Misses, s.LoadRetries, maxAttempts)
	}
}

// TestWriteInProgressNeverServedStale: a write that stamped the file
// before the load and completes after it (the copy holds a mix, and
// size, mtime and ctime are those taken at the load) is seen
// by its change event: the next lease has the file's bytes.
func TestWriteInProgressNeverServedStale(t *testing.T) {
	src := t.TempDir()
	const size = 64 << 10
	old, fresh := randomBytes(size, 1), randomBytes(size, 2)
	writeFile(t, src, "f", old)
	opts, io := testOptions()
	c := newCache(t, src, opts, io)
	needEvents(t, c)
	w := startBlockedWrite(t, filepath.Join(src, "f"), fresh, 8)
	if _, err := c.Stage(context.Background(), "f"); err != nil { // reads while the write runs
		t.Fatal(err)
	}
	w.finish(t)
	checkStaged(t, c, "f", fresh)
	if s := c.Stats(); s.ChangeEvents == 0 || s.Invalidations == 0 {
		t.Fatalf("no change event counted: %+v", s)
	}
}

// TestRacyRuleCatchesWriteInProgress: without events, a load of a file
// stamped less than staging.racy_window ago waits until the stamp is that
// old, so a write running at the load's start (shorter than the window)
// has completed before the load reads.
func TestRacyRuleCatchesWriteInProgress(t *testing.T) {
	src := t.TempDir()
	const size = 64 << 10
	old, fresh := randomBytes(size, 3), randomBytes(size, 4)
	writeFile(t, src, "f", old)
	d := newFake(1 << 20)
	var firstCopy time.Time
	var once sync.Once
	d.copyHook = func() error { once.Do(func() { firstCopy = time.Now() }); return nil }
	opts, io := testOptions()
	opts.Watch, opts.RacyWindow = WatchTimestamps, 3*time.Second
	c := newCache(t, src, opts, io, d)
	waiting := make(chan string, 1)
	c.hooks.racyWait = func(rel string) { waiting <- rel }
	if m := c.Stats().ChangeDetection; !strings.HasPrefix(m, "timestamps: staging.watch") {
		t.Fatalf("change detection %q", m)
	}
	w := startBlockedWrite(t, filepath.Join(src, "f"), fresh, 8)
	var st unix.Stat_t
	unix.Stat(filepath.Join(src, "f"), &st)
	stamp := time.Unix(0, max(st.Mtim.Nano(), st.Ctim.Nano()))
	staged := make(chan error, 1)
	go func() { _, err := c.Stage(context.Background(), "f"); staged <- err }()
	select {
	case <-waiting: // the load waits out the window; the write ends meanwhile
	case err := <-staged:
		w.finish(t)
		t.Fatalf("the load did not wait out the racy window (%v)", err)
	}
	w.finish(t)
	if err := <-staged; err != nil {
		t.Fatal(err)
	}
	if firstCopy.Before(stamp.Add(3 * time.Second)) {
		t.Fatalf("the load read at %v, before the stamp %v was the window old", firstCopy, stamp)
	}
	checkStaged(t, c, "f", fresh)
	if s := c.Stats(); s.RacyWaits != 1 || s.ChangeEvents != 0 {
		t.Fatalf("racy waits %d, change events %d", s.RacyWaits, s.ChangeEvents)
	}
}

// TestMmapWriteSeen: a store through a shared writable mapping to a page
// already dirty raises no event and stamps no time (no page fault); the
// last close of the writer's file (FAN_CLOSE_WRITE, once it unmapped)
// drops the staged copy. tmpfs: no writeback cleans the page meanwhile.
func TestMmapWriteSeen(t *testing.T) {
	src, err := os.MkdirTemp("/dev/shm", "gdsfs-mmap-")
	if err != nil {
		t.Fatalf("a tmpfs at /dev/shm: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(src) })
	const size = 64 << 10
	writeFile(t, src, "f", randomBytes(size, 5))
	opts, io := testOptions()
	c := newCache(t, src, opts, io)
	needEvents(t, c)
	f, err := os.OpenFile(filepath.Join(src, "f"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	m, err := unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	copy(m[100:], "first store") // the page is dirty from here on
	before, _ := os.ReadFile(filepath.Join(src, "f"))
	checkStaged(t, c, "f", before)
	copy(m[100:], "second store")
	unix.Munmap(m)
	f.Close()
	after, _ := os.ReadFile(filepath.Join(src, "f"))
	if bytes.Equal(after, before) {
		t.Fatal("the second store did not reach the file")
	}
	checkStaged(t, c, "f", after)
}
