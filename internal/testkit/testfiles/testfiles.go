// Package testfiles holds the file helpers tests of several packages
// share: deterministic random contents, writing a file beneath a
// directory, mapping a file the way a loader does, and counting the
// process's descriptors. Only tests import
// it.
package testfiles

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// RandomBytes returns n bytes that depend only on seed.
func RandomBytes(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, 7))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// WriteFile writes data to dir/rel, making its directories.
func WriteFile(t *testing.T, dir, rel string, data []byte) {
	t.Helper()
	p := filepath.Join(dir, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// MapFile maps size bytes of path read-only, and closes its descriptor, as
// a loader that reads the mapping after its close does. The mapping goes
// when unmap is called, or when the test ends.
func MapFile(t *testing.T, path string, size int) (unmap func()) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	m, err := unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ, unix.MAP_SHARED)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	unmap = func() {
		once.Do(func() {
			if err := unix.Munmap(m); err != nil {
				t.Error(err)
			}
		})
	}
	t.Cleanup(unmap)
	return unmap
}

// OpenFDs is the number of descriptors this process has open (the
// daemon's, in a test that serves in-process).
func OpenFDs(t *testing.T) int {
	t.Helper()
	es, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(es)
}
