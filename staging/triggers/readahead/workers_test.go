package readahead

import (
	"fmt"
	"math/rand/v2"
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
// every file asked for is used. Where the window (4 files) covers the
// readers' spread, most files are hits. Readers spread over up to
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
						if workers*batch <= 4 && s.Hits*2 < uint64(files) {
							t.Errorf("stats %+v: want at least half the files hits", s)
						}
						t.Logf("%+v", s)
					})
				}
			}
		}
	}
}
