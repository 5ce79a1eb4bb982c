package gputest

import (
	"context"
	"path/filepath"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/gdsfs/gdsfs/gpu"
	"github.com/gdsfs/gdsfs/gpu/cuda"
	"github.com/gdsfs/gdsfs/internal/units"
	"github.com/gdsfs/gdsfs/staging"
)

// openGPUs opens GPUs 0 and 1, skipping loudly where there are fewer.
func openGPUs(t *testing.T) []gpu.Device {
	t.Helper()
	openGPU(t) // fails without any GPU under GDSFS_REQUIRE_GPU=1
	var devs []gpu.Device
	for ord := range 2 {
		d, err := cuda.Open(ord, gpu.Options{ChunkSize: 1 << 30}, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)))
		if err != nil {
			t.Skipf("SKIPPED: needs 2 GPUs (GPU %d: %v)", ord, err)
		}
		t.Cleanup(func() { d.Close() })
		devs = append(devs, d)
	}
	return devs
}

// A file staged onto two GPUs by split ingest (or from SOURCE twice where
// the pair has no peer access), then a replica made by a peer copy; every
// byte of every replica checked, each lease on the GPU it asked for.
func TestReplicasTwoGPUs(t *testing.T) {
	devs := openGPUs(t)
	dir := testDir(t)
	c, err := staging.New(context.Background(), staging.Config{
		Source: dir,
		Options: staging.Options{Device: "cuda", GPUs: []int{0, 1}, Capacity: units.Share{Percent: 40},
			ChunkSize: 1 << 30, Prefetch: "manual", PrefetchQueue: 16, PrefetchWorkers: 1},
		IO: staging.IOOptions{CompatMode: staging.CompatOn, TaskSize: 16 << 20,
			BounceSize: 4 << 20, NumThreads: 8, DirectIO: staging.DirectOff},
		Devices: devs,
		Log:     zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	peers := len(c.Stats().Devices[0].Peers) == 1
	p := testFile(t, dir, 1<<30+4097)
	rel := filepath.Base(p)
	infos, err := c.StageOn(context.Background(), rel, []string{"all"})
	if err != nil {
		t.Fatal(err)
	}
	for _, info := range infos {
		t.Logf("%s: %s path, %.2f GB/s, %s", info.Device, info.LoadPath, info.GBps, info.Note)
	}
	if st := c.Stats(); peers && (st.SplitLoads != 1 || st.BytesPeer == 0) {
		t.Errorf("peer access between the GPUs but no split ingest: %+v", st)
	}
	for i, d := range devs {
		l, err := c.Acquire(context.Background(), staging.Request{Rel: rel, Device: d.Name()})
		if err != nil {
			t.Fatal(err)
		}
		if l.Device() != d.Name() {
			t.Errorf("lease asked on GPU %d is on %s", i, l.Device())
		}
		verify(t, l.Region(), p)
		l.Release()
	}
	// One replica evicted, then made again from the other by a peer copy.
	if err := c.EvictOn(rel, []string{"1"}); err != nil {
		t.Fatal(err)
	}
	l, err := c.Acquire(context.Background(), staging.Request{Rel: rel, Device: devs[1].Name()})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	verify(t, l.Region(), p)
	for _, e := range c.Entries() {
		if e.Device == devs[1].Name() && peers && e.LoadPath != staging.PathPeer {
			t.Errorf("the replica made again took the %s path (%s), want a peer copy", e.LoadPath, e.Note)
		}
	}
}
