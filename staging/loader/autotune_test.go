package loader

import (
	"testing"

	"github.com/gdsfs/gdsfs/internal/units"
)

// TestAutoIO: io.num_threads and io.bounce_size auto follow the measured
// rule (autotune.go).
func TestAutoIO(t *testing.T) {
	for _, tc := range []struct {
		cpus, threads int
		bounce        units.Size
	}{
		{1, 4, 4 << 20}, {2, 4, 4 << 20}, {8, 8, 4 << 20}, {12, 12, 4 << 20},
		{13, 13, 2 << 20}, {16, 16, 2 << 20}, {64, 16, 2 << 20},
	} {
		th := AutoThreads(tc.cpus)
		if b := AutoBounce(th); th != tc.threads || b != tc.bounce {
			t.Errorf("%d cores: %d workers of %s, want %d of %s", tc.cpus, th, b, tc.threads, tc.bounce)
		}
	}
	for _, n := range []int{1, 2, 3, 5, 7, 33, 256} {
		if b := AutoBounce(n); b < 1<<20 || b > 4<<20 || b&(b-1) != 0 {
			t.Errorf("%d workers: bounce %s", n, b)
		}
	}
}
