package staging_test

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/gdsfs/gdsfs/gpu"
	"github.com/gdsfs/gdsfs/gpu/host"
	"github.com/gdsfs/gdsfs/internal/units"
	"github.com/gdsfs/gdsfs/staging"
	"github.com/gdsfs/gdsfs/staging/stagingtest"
)

// maxIntegrityRounds bounds TestLeaseIntegrity's rounds.
const maxIntegrityRounds = 6

// TestLeaseIntegrity: leases under concurrent rewrites of every kind are
// never stale and never a mix (host backend; the GPU tier runs the same
// on CUDA). GDSFS_INTEGRITY_SECONDS sets the duration of a round (default 5);
// rounds run until at least 10 leases and 10 rewrites were checked.
func TestLeaseIntegrity(t *testing.T) {
	secs := 5
	if s := os.Getenv("GDSFS_INTEGRITY_SECONDS"); s != "" {
		secs, _ = strconv.Atoi(s)
	}
	dir := t.TempDir()
	c, err := staging.New(context.Background(), staging.Config{
		Source: dir,
		Options: staging.Options{Device: "host", GPUs: []int{0}, Capacity: units.Share{Bytes: 64 << 20},
			ChunkSize: 1 << 20, Prefetch: "manual", PrefetchQueue: 4, PrefetchWorkers: 1},
		IO:      staging.IOOptions{CompatMode: "on", TaskSize: 64 << 10, BounceSize: 16 << 10, NumThreads: 4, DirectIO: "off"},
		Devices: []gpu.Device{host.Open(gpu.Options{ChunkSize: 1 << 20})},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if m := c.Stats().ChangeDetection; m != "fanotify" {
		t.Fatalf("this test needs fanotify on TMPDIR's filesystem (root, a local filesystem): %s", m)
	}
	// Rounds until enough leases and rewrites were checked: a busy
	// machine does fewer of them in a round.
	var r stagingtest.IntegrityResult
	for round := 1; round <= maxIntegrityRounds && (r.Checked < 10 || r.Writes < 10); round++ {
		x := stagingtest.Integrity(t, c, dir, stagingtest.IntegrityOptions{
			Files: 3, Size: 3<<20 + 123, Readers: 4, Duration: time.Duration(secs) * time.Second})
		r.Checked += x.Checked
		r.Wrong += x.Wrong
		r.Unlocked += x.Unlocked
		r.Writes += x.Writes
		r.Errors += x.Errors
	}
	t.Logf("%+v; stats %+v", r, c.Stats())
	if r.Checked < 10 || r.Writes < 10 || r.Wrong != 0 || r.Errors != 0 {
		t.Fatalf("checked %d leases over %d rewrites: %d wrong, %d errors", r.Checked, r.Writes, r.Wrong, r.Errors)
	}
}
