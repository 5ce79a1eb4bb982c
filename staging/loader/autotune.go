package loader

import (
	"math/bits"

	"github.com/gdsfs/gdsfs/internal/units"
)

// io.num_threads and io.bounce_size "auto": a rule from measurements, not
// one machine's best guess.
//
// The POSIX path is a pread from the page cache into a pinned bounce
// buffer (a CPU copy) followed by a DMA of that buffer to the device; one
// worker keeps one copy engine stream busy only while its CPU keeps up.
// Small buffers (256 KiB) leave the copy engines idle between DMAs; large
// ones (16 MiB) leave the CPU caches before the DMA reads them and cost a
// trip to memory; `gdsfs bench stage` shows the curve on a machine. So:
//
//   - workers: one per core the process may run on, at least 4 (the
//     reads block on the disk when the file is cold) and at most 16
//     (beyond, the copy engines, not the CPUs, are the limit);
//   - bounce buffers: the bytes in flight (workers x 2 buffers) held near
//     the 96 MiB that measured best, each buffer a power of two between
//     1 MiB and 4 MiB: 4 MiB up to 12 workers, 2 MiB from 13 to 16.
//
// The rule is here, in one place, to be changed by what `gdsfs bench
// stage` shows.

// AutoThreads is io.num_threads=auto for cpus usable cores.
func AutoThreads(cpus int) int { return min(16, max(4, cpus)) }

// AutoBounce is io.bounce_size=auto for threads workers.
func AutoBounce(threads int) units.Size {
	const inFlight = 96 << 20
	per := inFlight / (2 * threads)
	per = 1 << (bits.Len(uint(per)) - 1) // round down to a power of two
	return units.Size(min(4<<20, max(1<<20, per)))
}
