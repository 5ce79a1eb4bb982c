package staging

import (
	"context"
	"errors"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/gpu"
)

// within runs fn and fails the test if it has not returned after a long
// while: what it guards against is blocking forever, not slowness.
func within(t *testing.T, what string, fn func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); fn() }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatalf("%s blocked", what)
	}
}

// TestSpecialFilesNeverBlock: a FIFO or a device node in
// SOURCE is never staged and never opened blocking: eligibility, staging,
// leasing and the xattr answer at once, a prefetch of one is dropped by
// its worker at once, and Close returns.
func TestSpecialFilesNeverBlock(t *testing.T) {
	src := t.TempDir()
	if err := unix.Mkfifo(filepath.Join(src, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A character device like /dev/null (1, 3): opening it would not
	// block, but it is no file to stage; reading a tty or a tape could.
	if err := unix.Mknod(filepath.Join(src, "null"), unix.S_IFCHR|0o644, int(unix.Mkdev(1, 3))); err != nil {
		t.Fatalf("mknod (the test runs as root): %v", err)
	}
	opts, io := testOptions()
	opts.PrefetchWorkers = 1
	c, err := New(context.Background(), Config{Source: src, Options: opts, IO: io, Devices: []gpu.Device{newFake(1 << 20)}, Queue: newQueue(opts, nil)})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan string, 4)
	c.hooks.prefetchDone = func(rel string) { done <- rel }
	ctx := context.Background()
	for _, rel := range []string{"fifo", "null"} {
		within(t, "Eligible "+rel, func() {
			if err := c.Eligible(rel); !errors.Is(err, syscall.EINVAL) {
				t.Errorf("Eligible(%s) = %v, want EINVAL (not a regular file)", rel, err)
			}
		})
		within(t, "Stage "+rel, func() {
			if _, err := c.Stage(ctx, rel); !errors.Is(err, syscall.EINVAL) {
				t.Errorf("Stage(%s) = %v, want EINVAL", rel, err)
			}
		})
		within(t, "Acquire "+rel, func() {
			if _, err := c.Acquire(ctx, Request{Rel: rel}); !errors.Is(err, syscall.EINVAL) {
				t.Errorf("Acquire(%s) = %v, want EINVAL", rel, err)
			}
		})
		within(t, "Attr "+rel, func() {
			if state, _ := c.Attr(rel); state != StateAbsent {
				t.Errorf("Attr(%s) = %s", rel, state)
			}
		})
		if !c.Prefetch(rel) {
			t.Fatalf("prefetch of %s refused", rel)
		}
		within(t, "the prefetch of "+rel, func() { <-done })
	}
	c.Prefetch("fifo")
	within(t, "Close", func() { c.Close() })
	if s := c.Stats(); s.Misses != 0 || s.StagedFiles != 0 {
		t.Fatalf("a special file was staged: %+v", s)
	}
}
