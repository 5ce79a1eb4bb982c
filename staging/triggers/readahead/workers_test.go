package readahead

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// As scripts/readahead-gpu.py runs it: a DataLoader of 4 workers,
// prefetch_factor 2, over 64 shards in name order, each item leasing its
// shard. A read-ahead load takes about as long as the workers' next few
// accesses, so the loads are still in flight when the readers' positions
// pass each other. What read-ahead asked for must be used, not cancelled
// because a faster worker went past it, and most shards must be hits.
// Fetch times vary from 0.5 to 1.5 (spread 1) or to 4.5 (spread 4: a
// hit is quick, a miss waits for the disk), which puts the accesses out
// of step by up to 2×workers positions.
func TestDataLoaderWorkersLeasingInNameOrder(t *testing.T) {
	for _, spread := range []float64{1, 4} {
		for seed := range uint64(4) {
			c := newFake(t, Defaults(), Tuning{}, map[string][]Entry{"d": shards(64, 32<<20)})
			c.lag = 4
			order := dataLoaderAccesses(64, 4, 1, 2, spread, rand.New(rand.NewPCG(seed, 64)))
			c.open(seq("d", order...)...)
			s := c.ra.Stats()
			t.Logf("spread %g, seed %d: out of step by up to %d: %+v", spread, seed, outOfStep(order), s)
			if s.Cancelled != 0 || s.WastedBytes != 0 || s.Hits < 32 {
				t.Errorf("spread %g, seed %d: order %v: stats %+v: want nothing cancelled or wasted and at least 32 hits of 64",
					spread, seed, order, s)
			}
		}
	}
}

// outOfStep is the largest distance between an access's position in
// order and the position it names.
func outOfStep(order []int) int {
	most := 0
	for k, i := range order {
		most = max(most, k-i, i-k)
	}
	return most
}

// Any number of workers (up to 16) and batch sizes, shuffle=False:
// nothing is cancelled while the readers follow name order together, and
// every file asked for is used. Wherever a run picks the readers up
// (detectable), at least half the files are hits: the window covers the
// readers' spread. Readers spread over up to
// 2×workers×batch files (prefetch_factor 2); a run follows a spread of
// up to a quarter of the directory (limits), so the cases are those with
// workers×batch at most files/8 (16 workers × batch 8 over 1000 files;
// 8 workers × batch 1 over 64). Wider (16 workers over 64 files) is left
// out: there, read-ahead may plan and cancel a few files.
func TestDataLoaderWorkersAndBatchesNeverCancel(t *testing.T) {
	for _, files := range []int{64, 1000} {
		for _, workers := range []int{1, 2, 4, 8, 16} {
			for _, batch := range []int{1, 2, 4, 8} {
				if workers*batch > files/8 {
					continue
				}
				for _, lag := range []int{1, workers, 2 * workers} {
					t.Run(fmt.Sprintf("%d files, %d workers, batch %d, lag %d", files, workers, batch, lag), func(t *testing.T) {
						c := newFake(t, Defaults(), Tuning{}, map[string][]Entry{"d": shards(files, 1)})
						c.lag = lag
						order := dataLoaderAccesses(files, workers, batch, 2, 4, rand.New(rand.NewPCG(uint64(workers), uint64(batch))))
						c.open(seq("d", order...)...)
						s := c.ra.Stats()
						if s.Cancelled != 0 || s.WastedBytes != 0 {
							t.Errorf("stats %+v: want nothing cancelled or wasted", s)
						}
						if open := uint64(len(c.window())); s.Hits+open < s.Issued {
							t.Errorf("stats %+v, %d still in the window: want every file issued used", s, open)
						}
						if detectable(files, workers, batch) && s.Hits*2 < uint64(files) {
							t.Errorf("stats %+v: want at least half the files hits", s)
						}
						t.Logf("%+v", s)
					})
				}
			}
		}
	}
}

// detectable reports whether a run picks up workers DataLoader workers
// taking batches of batch items over files files (prefetch_factor 2):
// items one at a time arrive nearly in order at first, so the run is
// sure before the workers spread; batches arrive as a stride (the first
// item of each), and the run is sure only once the workers' spread of
// 2×workers×batch fits the young run's limit (4×slack, files/8: 32
// positions over 1000 files, 8 over 64).
func detectable(files, workers, batch int) bool {
	if workers*batch > files/8 {
		return false // beyond a quarter of the directory: not followed
	}
	return batch == 1 || int64(2*workers*batch) <= New(Config{}).limits(files).ahead
}

// The window covers as many files as the readers spread over: 8 and 16
// DataLoader workers (prefetch_factor 2), items one by one or in batches,
// spread over about 2×workers×batch positions, and loads that take as long
// as workers or 2×workers accesses. Wherever a run picks the readers up
// (detectable), nothing is cancelled or wasted and at least 7/8 of the
// files are hits with readahead_files at its default of 4 (measured: 58
// of 64 and 980 of 1000 at worst; the misses are the files the readers
// took before the run was sure). A window of 4 files holds the files the
// slowest workers take next and the fastest miss: 47 to 54 of 64, 821 to
// 853 of 1000 for 8 workers, 549 to 613 for 16, 455 to 477 for 8 workers
// taking batches of 2.
func TestWindowCoversTheWorkersSpread(t *testing.T) {
	for _, files := range []int{64, 1000} {
		for _, workers := range []int{8, 16} {
			for _, batch := range []int{1, 2} {
				if !detectable(files, workers, batch) {
					continue
				}
				for _, lag := range []int{workers, 2 * workers} {
					t.Run(fmt.Sprintf("%d files, %d workers, batch %d, lag %d", files, workers, batch, lag), func(t *testing.T) {
						for seed := range uint64(4) {
							c := newFake(t, Defaults(), Tuning{}, map[string][]Entry{"d": shards(files, 1)})
							c.lag = lag
							order := dataLoaderAccesses(files, workers, batch, 2, 4, rand.New(rand.NewPCG(seed, uint64(files))))
							c.open(seq("d", order...)...)
							s := c.ra.Stats()
							t.Logf("seed %d: %+v", seed, s)
							if s.Cancelled != 0 || s.WastedBytes != 0 {
								t.Errorf("seed %d: stats %+v: want nothing cancelled or wasted", seed, s)
							}
							if s.Hits*8 < uint64(files)*7 {
								t.Errorf("seed %d: stats %+v: want at least %d hits of %d", seed, s, files*7/8, files)
							}
						}
					})
				}
			}
		}
	}
}

// A lone reader (its run's reach is 0) keeps a window of readahead_files
// files, whatever the directory's size: the window grows only for readers
// that spread.
func TestLoneReaderWindowIsReadaheadFiles(t *testing.T) {
	for _, files := range []int{64, 1000} {
		for _, n := range []int{1, 4, 9} {
			c := newFake(t, Options{Files: n, Bytes: Defaults().Bytes}, Tuning{}, map[string][]Entry{"d": shards(files, 1)})
			c.lag = 2
			for i := range files {
				c.open(name("d", i))
				if i < 4 || i+n >= files {
					continue // not sure yet; near the end, fewer files are left
				}
				if got, want := c.window(), seq("d", span(i+1, i+1+n)...); !slices.Equal(got, want) {
					t.Fatalf("%d files, readahead_files %d, after %d: window %q, want %q", files, n, i, got, want)
				}
			}
		}
	}
}

// Over several epochs in name order the order seen before predicts (it
// carries the wrap-around from the last file to the first, where name
// order restarts); the window keeps the width the workers spread over:
// nothing is cancelled or wasted and every epoch has at least 7/8 of the
// files hits (measured: 917 of 1000 at worst). A window of 4 files: 710
// to 853 for 8 workers, 521 to 595 for 16.
func TestWindowCoversTheWorkersSpreadOverEpochs(t *testing.T) {
	for _, workers := range []int{8, 16} {
		c := newFake(t, Defaults(), Tuning{}, map[string][]Entry{"d": shards(1000, 1)})
		c.lag = workers
		for epoch := range uint64(4) {
			before := c.ra.Stats().Hits
			order := dataLoaderAccesses(1000, workers, 1, 2, 4, rand.New(rand.NewPCG(epoch, 1000)))
			c.open(seq("d", order...)...)
			s := c.ra.Stats()
			t.Logf("%d workers, epoch %d: %d hits: %+v", workers, epoch, s.Hits-before, s)
			if s.Cancelled != 0 || s.WastedBytes != 0 {
				t.Errorf("%d workers, epoch %d: stats %+v: want nothing cancelled or wasted", workers, epoch, s)
			}
			if hits := s.Hits - before; hits*8 < 1000*7 {
				t.Errorf("%d workers, epoch %d: %d hits of 1000: want at least 875", workers, epoch, hits)
			}
		}
	}
}
