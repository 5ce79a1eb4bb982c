// Package bench is `gdsfs bench`: measurements of gdsfs against baselines
// taken in the same run, printed as tables with their ratios and targets.
// Each command's exit status is its verdict (VerdictRule in report.go): 0
// only when every target that applies passed; a missed target, a failed
// correctness check, a case that could not run and a target that could
// not be checked all exit 1.
//
//   - Mount (bench mount): read throughput and lstat rate of native, gdsfs
//     with and without passthrough, and go-fuse's loopback example, each
//     mounted by running a daemon (this binary, self-exec).
//   - Stage (bench stage): gdsfs's defaults and each load path against the
//     pinned host-to-device copy, the disk's O_DIRECT rate, KvikIO's reader
//     over a small sweep (kvikio.go) in interleaved rounds, and with
//     peers.py the usual PyTorch ways to load a file.
//   - Lease (bench lease): first and repeat leases of resident files, Go
//     (lease-child, self-exec) and Python (lease.py), against the raw
//     export / import-and-map primitive (floor.py).
//   - Loader (bench loader): DataLoader epochs with leases against read()
//     through the mount, and gdsfs.load of a file not yet resident against
//     the pinned copy (loader.py).
//   - Contention (bench contention): consumer processes leasing more than
//     the capacity holds (contention.py).
//   - MultiGPU (bench multigpu): two devices: H2D, peer copy and memcpy
//     baselines, split ingest vs staging twice, two files at once vs one,
//     and consumers per device through a mount (multigpu.py).
//   - Script (bench autoload, bench readahead): the GPU scripts
//     scripts/autoload-gpu.py and scripts/readahead-gpu.py, embedded by
//     package scripts.
//
// The Python helpers are files beside this one, embedded and written out
// when run; they use only the public client API (gdsfs.open, load, stat,
// disconnect) and feature-detect the newer parts (open_many, gdsfs.torch).
// Waiting on a daemon run as another process uses the events it gives
// (wait.go): READY=1 on $NOTIFY_SOCKET for gdsfs, the mount table's change
// notice for the loopback example, and the lease socket's wait and
// wait_stat for files staged or evicted and leases ended. Nothing is
// polled on a timer. Nothing here is imported by the daemon's own code
// paths.
package bench
