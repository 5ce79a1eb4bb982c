package fs

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/internal/testkit/testfiles"
	"github.com/gdsfs/gdsfs/internal/units"
)

// TestOpenPerUID: auto is a quarter of the descriptors staging leaves
// out of its budget; a set value over half of them fails, naming the key.
func TestOpenPerUID(t *testing.T) {
	for _, tc := range []struct {
		set   int
		limit uint64
		want  int
		err   string
	}{
		{0, 20000, 1250, ""},
		{0, 1024, 128, ""},
		{0, 1 << 40, 1 << 20, ""},
		{50, 20000, 50, ""},
		{2500, 20000, 2500, ""},
		{2501, 20000, 0, "fuse.max_open_per_uid: 2501 is more than half"},
	} {
		o := Options{MaxOpenPerUID: units.AutoCount(tc.set)}
		got, err := o.OpenPerUID(tc.limit)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%d of %d: %v, want an error with %q", tc.set, tc.limit, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%d of %d: %d, %v; want %d", tc.set, tc.limit, got, err, tc.want)
		}
	}
}

// TestKeptBounded: files unlinked through the mount while reached (an
// O_PATH descriptor held on them) are kept by the daemon up to
// fuse.max_open_per_uid of them; past it none is kept: the daemon's
// descriptors stop growing, the refusal is counted, and a racing open of
// such a file fails as on a filesystem that keeps nothing.
func TestKeptBounded(t *testing.T) {
	const bound, extra = 8, 5
	if os.Geteuid() != 0 {
		t.Skip("SKIPPED: mounting FUSE needs root (run make test as root)")
	}
	src, mnt := t.TempDir(), t.TempDir()
	srv, err := Mount(Config{Source: src, Mountpoint: mnt, Options: Options{
		Passthrough: PassthroughOff, MaxRead: units.Size(1 << 20), EntryTimeout: time.Second, AttrTimeout: time.Second,
		MaxOpenPerUID: bound,
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := srv.Unmount(); err != nil {
			t.Error(err)
		}
		srv.Wait()
	})
	var reached []int
	t.Cleanup(func() {
		for _, fd := range reached {
			unix.Close(fd)
		}
	})
	for i := range bound + extra {
		p := filepath.Join(mnt, fmt.Sprintf("f%d", i))
		if err := os.WriteFile(p, []byte("old"), 0o644); err != nil {
			t.Fatal(err)
		}
		fd, err := unix.Open(p, unix.O_PATH|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		reached = append(reached, fd)
	}
	// The kernel releases the written files after close returns: wait
	// until the daemon closed their backing files before counting.
	for deadline := time.Now().Add(10 * time.Second); srv.OpenFiles() != 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d files still open through the mount 10s after the last close", srv.OpenFiles())
		}
	}
	before := testfiles.OpenFDs(t) // the test's own O_PATH descriptors are in both counts
	for i := range bound + extra {
		if err := os.Remove(filepath.Join(mnt, fmt.Sprintf("f%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	if grew := testfiles.OpenFDs(t) - before; grew != bound {
		t.Errorf("the daemon holds %d more descriptors after %d unlinks of reached files, want %d (fuse.max_open_per_uid)",
			grew, bound+extra, bound)
	}
	if got := srv.Stats().NotKept; got != extra {
		t.Errorf("Stats().NotKept = %d, want %d", got, extra)
	}
	for i, fd := range reached {
		b, err := os.ReadFile(fmt.Sprintf("/proc/self/fd/%d", fd))
		switch {
		case i < bound && (err != nil || string(b) != "old"):
			t.Errorf("racing open of kept f%d: %q, %v; want the old file", i, b, err)
		case i >= bound && err == nil:
			t.Errorf("racing open of f%d, past the bound: %q, want an error (not kept)", i, b)
		}
	}
}
