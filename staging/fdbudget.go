package staging

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// Descriptors are a budget like memory. The host backend keeps one memfd
// open per chunk of every staged file, so staged files alone could use up
// RLIMIT_NOFILE and leave the FUSE server unable to open the files it
// serves. The cache counts the descriptors its regions hold against a
// budget, evicting unleased entries in LRU order when it is reached, the
// way it does for bytes; the rest of the limit is a reserve for
// everything else: the FUSE server's open files, lease connections and the
// descriptors they pass, loads in flight.
//
// The reserve is a quarter of the limit, and at least 512 descriptors;
// with the usual hard limit of 524288 (systemd) or 1048576 the budget is
// far beyond what a dataset needs; with 4096 it is 3072.

// minFDReserve is the smallest reserve kept out of the budget.
const minFDReserve = 512

// fdBudget splits limit into the cache's budget and the reserve.
func fdBudget(limit uint64) (budget, reserve int) {
	limit = min(limit, 1<<24) // RLIM_INFINITY and other absurdities
	reserve = max(minFDReserve, int(limit/4))
	return max(0, int(limit)-reserve), reserve
}

// noFile is the soft RLIMIT_NOFILE.
func noFile() (uint64, error) {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
		return 0, fmt.Errorf("getrlimit(RLIMIT_NOFILE): %w", err)
	}
	return rl.Cur, nil
}

// RaiseNoFile raises this process's soft RLIMIT_NOFILE to its hard limit
// (the daemon does it at start, before the cache sizes its budget) and
// returns the limits in force.
func RaiseNoFile() (soft, hard uint64, err error) {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
		return 0, 0, fmt.Errorf("getrlimit(RLIMIT_NOFILE): %w", err)
	}
	if rl.Cur < rl.Max {
		rl.Cur = rl.Max
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
			return 0, 0, fmt.Errorf("setrlimit(RLIMIT_NOFILE, %d): %w", rl.Max, err)
		}
	}
	return rl.Cur, rl.Max, nil
}
