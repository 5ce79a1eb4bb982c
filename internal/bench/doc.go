// Package bench is `gdsfs bench`: measurements of gdsfs against baselines
// taken in the same run, printed as tables with their ratios and targets.
//
//   - Mount (bench mount): read throughput and lstat rate of native, gdsfs
//     with and without passthrough, and go-fuse's loopback example, each
//     mounted by running a daemon (this binary, self-exec).
//   - Stage (bench stage): each load path of the staging cache against the
//     pinned host-to-device copy, the disk's O_DIRECT rate and, with
//     peers.py, the usual PyTorch ways to load a file.
//   - Lease (bench lease): acquire to a usable pointer or tensor (lease.py)
//     against staging the file again.
//
// The Python helpers are files beside this one, embedded and written out
// when run. Waiting on a mount run by another process polls its control
// files and xattrs (staging.Cache.Subscribe is in-process only). Nothing
// here is imported by the daemon's own code paths.
package bench
