package staging

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// TestSourceReplaced: the cache stages from the directory SOURCE was when
// it started, as the mount serves it: removed and made again, SOURCE's
// files are gone for the cache too, old names and new.
func TestSourceReplaced(t *testing.T) {
	parent := t.TempDir()
	src := filepath.Join(parent, "src")
	writeFile(t, src, "d/f", randomBytes(20000, 1))
	opts, io := testOptions()
	c := newCache(t, src, opts, io)
	checkStaged(t, c, "d/f", randomBytes(20000, 1))
	if err := os.RemoveAll(src); err != nil {
		t.Fatal(err)
	}
	writeFile(t, src, "d/f", randomBytes(30000, 2))
	writeFile(t, src, "d/g", randomBytes(30000, 3))
	for _, rel := range []string{"d/f", "d/g"} {
		if _, err := c.Acquire(context.Background(), Request{Rel: rel}); !errors.Is(err, syscall.ENOENT) {
			t.Errorf("acquire %s after SOURCE was made again: %v, want ENOENT", rel, err)
		}
	}
}

// TestLongPath: a path of nearly PATH_MAX bytes under SOURCE stages
// (resolved from SOURCE's descriptor, never as SOURCE/rel).
func TestLongPath(t *testing.T) {
	src := t.TempDir()
	dir, err := unix.Open(src, unix.O_DIRECTORY|unix.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	var parts []string
	name := strings.Repeat("d", 250)
	for unix.PathMax-1-len(strings.Join(parts, "/"))-1 > 255 {
		if err := unix.Mkdirat(dir, name, 0o755); err != nil {
			t.Fatal(err)
		}
		next, err := unix.Openat(dir, name, unix.O_DIRECTORY|unix.O_RDONLY, 0)
		unix.Close(dir)
		if err != nil {
			t.Fatal(err)
		}
		dir = next
		parts = append(parts, name)
	}
	name = strings.Repeat("f", unix.PathMax-1-len(strings.Join(parts, "/"))-1) // rel: PATH_MAX-1 bytes
	fd, err := unix.Openat(dir, name, unix.O_CREAT|unix.O_WRONLY, 0o644)
	unix.Close(dir)
	if err != nil {
		t.Fatal(err)
	}
	data := randomBytes(5000, 3)
	unix.Write(fd, data)
	unix.Close(fd)
	rel := strings.Join(append(parts, name), "/")
	if len(rel) != unix.PathMax-1 {
		t.Fatalf("path of %d bytes: not long enough for the test", len(rel))
	}
	opts, io := testOptions()
	c := newCache(t, src, opts, io)
	checkStaged(t, c, rel, data)
}

// TestDescriptorBudget: staged regions hold descriptors (one memfd per
// chunk on the host backend); they are counted against a budget taken
// from the descriptor limit, and unleased entries are evicted in LRU order
// when it is reached, so staging never runs the daemon out of descriptors.
func TestDescriptorBudget(t *testing.T) {
	src := t.TempDir()
	opts, io := testOptions()
	c := newCacheCfg(t, Config{Source: src, Options: opts, IO: io, NoFile: 600})
	s := c.Stats()
	if s.DescriptorBudget != 600-minFDReserve || s.DescriptorReserve != minFDReserve {
		t.Fatalf("budget %d reserve %d", s.DescriptorBudget, s.DescriptorReserve)
	}
	ctx := context.Background()
	for i := range 3 * s.DescriptorBudget {
		rel := fmt.Sprintf("f%03d", i)
		writeFile(t, src, rel, randomBytes(100, uint64(i)))
		if _, err := c.Stage(ctx, rel); err != nil {
			t.Fatalf("stage %s: %v", rel, err)
		}
	}
	s = c.Stats()
	if s.DescriptorsUsed != s.DescriptorBudget || s.StagedFiles != s.DescriptorBudget || s.Evictions != uint64(2*s.DescriptorBudget) {
		t.Fatalf("descriptors %d of %d, staged %d, evictions %d", s.DescriptorsUsed, s.DescriptorBudget, s.StagedFiles, s.Evictions)
	}
	// The most recent files stayed.
	if state, _ := c.Attr(fmt.Sprintf("f%03d", 3*s.DescriptorBudget-1)); state != StateResident {
		t.Fatalf("the last file staged is %s", state)
	}
	// A file of more chunks than the budget is never staged.
	writeFile(t, src, "huge", make([]byte, (s.DescriptorBudget+1)<<20))
	if _, err := c.Stage(ctx, "huge"); !errors.Is(err, syscall.EFBIG) {
		t.Fatalf("a file needing more descriptors than the budget: %v", err)
	}
}
