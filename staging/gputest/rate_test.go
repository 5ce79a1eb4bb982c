package gputest

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gdsfs/gdsfs/internal/units"
	"github.com/gdsfs/gdsfs/staging"
)

// TestRateExperiment compares ways of moving a page-cache-warm file to the
// device. It only runs with GDSFS_EXPERIMENT=1 (it takes a minute).
func TestRateExperiment(t *testing.T) {
	if os.Getenv("GDSFS_EXPERIMENT") != "1" {
		t.Skip("SKIPPED: GDSFS_EXPERIMENT=1 not set")
	}
	dev := openGPU(t)
	dir := testDir(t)
	const size = 4 << 30
	p := testFile(t, dir, size)
	os.ReadFile(p) // warm the page cache
	region, err := dev.Alloc(size)
	if err != nil {
		t.Fatal(err)
	}
	defer region.Free()

	// Raw pinned host-to-device rate: 512 MiB buffers, 2 GiB copied.
	w, _ := dev.NewWorker(512 << 20)
	start := time.Now()
	for k := range 4 {
		w.Wait(k & 1)
		w.CopyAsync(region, int64(k)<<29, k&1, 512<<20)
	}
	w.Wait(0)
	w.Wait(1)
	t.Logf("pinned H2D: %.1f GB/s", 2.0*(1<<30)/time.Since(start).Seconds()/1e9)
	w.Close()

	// The staging paths at several thread counts and bounce sizes, each
	// cache made (workers and pinned buffers ready) before the clock starts.
	for _, compat := range []string{"on", "off"} {
		for _, threads := range []int{8, 12, 16} {
			for _, bounce := range []int{256 << 10, 1 << 20, 2 << 20, 4 << 20, 16 << 20} {
				if compat == "off" && bounce != 1<<20 {
					continue // cuFile has no bounce buffers of ours
				}
				cc, err := staging.New(context.Background(), staging.Config{Source: dir,
					Options: staging.Options{Device: "cuda", GPUs: []int{0}, Capacity: sharePercent(50), ChunkSize: 1 << 30,
						Prefetch: "manual", PrefetchQueue: 4, PrefetchWorkers: 1},
					IO:      staging.IOOptions{CompatMode: compat, TaskSize: 16 << 20, BounceSize: units.AutoSize(bounce), NumThreads: units.AutoCount(threads), DirectIO: "off"},
					Devices: []gpuDevice{dev}})
				if err != nil {
					t.Fatal(err)
				}
				time.Sleep(100 * time.Millisecond) // workers allocate their buffers
				best := 0.0
				for range 2 {
					start := time.Now()
					info, err := cc.Stage(context.Background(), filepath.Base(p))
					if err != nil {
						t.Fatal(err)
					}
					best = max(best, size/time.Since(start).Seconds()/1e9)
					if compat == "off" && info.LoadPath != "cufile" {
						t.Fatalf("compat off took %s", info.LoadPath)
					}
					cc.Evict(filepath.Base(p))
				}
				t.Logf("compat %s, %d threads, %d KiB bounce: %.1f GB/s", compat, threads, bounce>>10, best)
				cc.Close()
			}
		}
	}

}
