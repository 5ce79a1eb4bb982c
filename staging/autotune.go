package staging

import (
	"math/bits"
	"runtime"

	"github.com/gdsfs/gdsfs/internal/units"
)

// io.num_threads and io.bounce_size "auto": a rule from measurements, not
// one machine's best guess.
//
// The POSIX path is a pread from the page cache into a pinned bounce
// buffer (a CPU copy) followed by a DMA of that buffer to the device; one
// worker keeps one copy engine stream busy only while its CPU keeps up.
// On the H200 machine (16 cores, one socket's share of a Sapphire Rapids
// host) a warm 4 GiB file moved at 43.6-45.9 GB/s with 12 workers and
// 4 MiB buffers and 48.4-48.6 GB/s with 16 workers and 2 MiB, against
// KvikIO's best of 45.8-47.1 (16 threads); 256 KiB buffers gave 20 GB/s
// and 16 MiB 35 GB/s (a buffer that leaves the CPU caches before the DMA
// reads it costs a trip to memory). So:
//
//   - workers: one per core the process may run on, at least 4 (the
//     reads block on the disk when the file is cold) and at most 16
//     (beyond, the copy engines, not the CPUs, are the limit);
//   - bounce buffers: the bytes in flight (workers x 2 buffers) held near
//     the 96 MiB that measured best, each buffer a power of two between
//     1 MiB and 4 MiB: 4 MiB up to 12 workers, 2 MiB from 13 to 16.
//
// The lead's H200 runs re-measure it (`gdsfs bench stage`); the rule is
// here, in one place, to be changed by what they show.

// autoThreads is io.num_threads=auto for cpus usable cores.
func autoThreads(cpus int) int { return min(16, max(4, cpus)) }

// autoBounce is io.bounce_size=auto for threads workers.
func autoBounce(threads int) units.Size {
	const inFlight = 96 << 20
	per := inFlight / (2 * threads)
	per = 1 << (bits.Len(uint(per)) - 1) // round down to a power of two
	return units.Size(min(4<<20, max(1<<20, per)))
}

// resolved is o with auto values replaced by the rule's.
func (o IOOptions) resolved() IOOptions {
	if o.NumThreads.Auto() {
		o.NumThreads = units.AutoCount(autoThreads(runtime.NumCPU()))
	}
	if o.BounceSize.Auto() {
		o.BounceSize = units.AutoSize(autoBounce(int(o.NumThreads)))
	}
	return o
}
