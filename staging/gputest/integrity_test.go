package gputest

import (
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/gdsfs/gdsfs/staging"
	"github.com/gdsfs/gdsfs/staging/stagingtest"
)

// TestLeaseIntegrityCUDA: on the CUDA backend, the sha256 of every lease
// taken with no write running equals the file's at that moment, while
// other leases make loads straddle in-place rewrites, renames over,
// truncations and stores through shared mappings. POSIX path, and the
// cuFile path where cuFile works. GDSFS_INTEGRITY_SECONDS (default 30)
// per path.
func TestLeaseIntegrityCUDA(t *testing.T) {
	secs := 30
	if s := os.Getenv("GDSFS_INTEGRITY_SECONDS"); s != "" {
		secs, _ = strconv.Atoi(s)
	}
	dev := openGPU(t)
	for _, compat := range []string{staging.CompatOn, staging.CompatOff} {
		t.Run("compat_mode="+compat, func(t *testing.T) {
			if compat == staging.CompatOff {
				needCuFile(t, dev)
			}
			dir, err := os.MkdirTemp(testDir(t), "integrity-")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.RemoveAll(dir) })
			c := newCache(t, dev, dir, compat)
			if m := c.Stats().ChangeDetection; m != "fanotify" {
				t.Fatalf("GDSFS_TEST_DIR must be on a local disk filesystem and the test run as root: change detection is %s", m)
			}
			r := stagingtest.Integrity(t, c, dir, stagingtest.IntegrityOptions{
				Files: 4, Size: 64<<20 + 4321, Readers: 8, Duration: time.Duration(secs) * time.Second})
			s := c.Stats()
			t.Logf("%s: %d leases checked (sha256 against the file), %d taken during writes, %d rewrites; "+
				"change events %d, load retries %d, invalidations %d", compat, r.Checked, r.Unlocked, r.Writes,
				s.ChangeEvents, s.LoadRetries, s.Invalidations)
			if r.Checked == 0 || r.Wrong != 0 || r.Errors != 0 {
				t.Fatalf("%d of %d leases wrong, %d errors", r.Wrong, r.Checked, r.Errors)
			}
		})
	}
}
