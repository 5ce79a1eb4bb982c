// Package stagingtest holds checks of a staging.Cache shared by the unit
// tier (host backend) and the GPU tier (CUDA backend).
package stagingtest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/staging"
)

// IntegrityOptions shape an Integrity run.
type IntegrityOptions struct {
	Files    int           // files rewritten and leased
	Size     int           // bytes per file (rewrites keep it, or change it by a page)
	Readers  int           // goroutines leasing
	Duration time.Duration // how long writers and readers run
}

// IntegrityResult counts what the run saw.
type IntegrityResult struct {
	Checked  int64 // leases compared with the file at that moment
	Wrong    int64 // of them, bytes that were not the file's
	Unlocked int64 // leases taken while writes ran (they make loads straddle writes)
	Writes   int64 // rewrites done: in place, rename over, truncate, mmap
	Errors   int64 // acquires that failed with no write running
}

// Integrity runs writers that rewrite files in dir (which c stages) in
// every way a file changes (one pwrite in place, rename over, truncate and
// write, stores through a shared mapping) while readers lease them. Half
// the leases are taken while writes may run, so loads straddle writes;
// the other half are taken with the file's writer held off, and their
// bytes (SHA-256) must be the file's at that moment: a write that
// completed before the acquire must show, and no mix of old and new bytes
// may. It fails t on any wrong lease.
func Integrity(t testing.TB, c *staging.Cache, dir string, o IntegrityOptions) IntegrityResult {
	var res IntegrityResult
	files := make([]*guarded, o.Files)
	for i := range files {
		files[i] = &guarded{rel: fmt.Sprintf("integrity-%d.bin", i), path: filepath.Join(dir, fmt.Sprintf("integrity-%d.bin", i))}
		if err := os.WriteFile(files[i].path, content(i, 0, o.Size), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.Duration)
	defer cancel()
	var wg sync.WaitGroup
	for i, g := range files {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for v := 1; ctx.Err() == nil; v++ {
				if err := g.rewrite(i, v, o.Size); err != nil {
					t.Errorf("rewrite %s: %v", g.rel, err)
					return
				}
				atomic.AddInt64(&res.Writes, 1)
			}
		}()
	}
	for r := range o.Readers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rnd := rand.New(rand.NewPCG(uint64(r), 1))
			for ctx.Err() == nil {
				g := files[rnd.IntN(len(files))]
				if rnd.IntN(2) == 0 {
					leaseHash(c, g.rel) // while writes run: unchecked
					atomic.AddInt64(&res.Unlocked, 1)
					continue
				}
				g.mu.RLock()
				got, err := leaseHash(c, g.rel)
				want := fileHash(g.path)
				g.mu.RUnlock()
				switch {
				case err != nil:
					atomic.AddInt64(&res.Errors, 1)
					t.Errorf("acquire %s with no write running: %v", g.rel, err)
				case got != want:
					atomic.AddInt64(&res.Wrong, 1)
					t.Errorf("%s: a lease's bytes are not the file's (sha256 %s, file %s)", g.rel, got, want)
				}
				atomic.AddInt64(&res.Checked, 1)
			}
		}()
	}
	wg.Wait()
	return res
}

// guarded is one file and the lock that holds its writer off.
type guarded struct {
	rel, path string
	mu        sync.RWMutex // write: a rewrite runs
}

// content is version v of file i: n bytes (n plus a page on odd versions
// written by truncate, so sizes change too).
func content(i, v, n int) []byte {
	r := rand.New(rand.NewPCG(uint64(i), uint64(v)))
	b := make([]byte, n)
	for k := 0; k < n; k += 8 {
		x := r.Uint64()
		for j := 0; j < 8 && k+j < n; j++ {
			b[k+j] = byte(x >> (8 * j))
		}
	}
	return b
}

// rewrite writes version v, in the way v picks.
func (g *guarded) rewrite(i, v, size int) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch v % 4 {
	case 0: // one pwrite in place: size, and maybe stamps, unchanged
		f, err := os.OpenFile(g.path, os.O_WRONLY, 0)
		if err != nil {
			return err
		}
		st, _ := f.Stat()
		_, err = f.WriteAt(content(i, v, int(st.Size())), 0)
		return errors.Join(err, f.Close())
	case 1: // rename over
		tmp := g.path + ".tmp"
		if err := os.WriteFile(tmp, content(i, v, size), 0o644); err != nil {
			return err
		}
		return os.Rename(tmp, g.path)
	case 2: // truncate and write, one page longer
		return os.WriteFile(g.path, content(i, v, size+4096), 0o644)
	default: // stores through a shared mapping
		f, err := os.OpenFile(g.path, os.O_RDWR, 0)
		if err != nil {
			return err
		}
		defer f.Close()
		st, err := f.Stat()
		if err != nil || st.Size() == 0 {
			return err
		}
		m, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		if err != nil {
			return err
		}
		copy(m, content(i, v, int(st.Size())))
		return unix.Munmap(m)
	}
}

func leaseHash(c *staging.Cache, rel string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	l, err := c.Acquire(ctx, staging.Request{Rel: rel})
	if err != nil {
		return "", err
	}
	defer l.Release()
	buf := make([]byte, l.Size())
	if len(buf) > 0 {
		if _, err := l.Region().ReadAt(buf, 0); err != nil {
			return "", err
		}
	}
	return hashOf(buf), nil
}

func fileHash(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "read: " + err.Error()
	}
	return hashOf(b)
}

func hashOf(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
