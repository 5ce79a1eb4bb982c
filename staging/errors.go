package staging

import (
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/gdsfs/gdsfs/staging/loader"
)

// Errors wrap an errno so callers (the FUSE layer, the lease socket) can
// answer with it: errors.Is(err, syscall.EFBIG).
func errNotEligible(rel, why string) error {
	return fmt.Errorf("%s: not staged: %s: %w", rel, why, syscall.EINVAL)
}

func errNotResident(rel string) error {
	return fmt.Errorf("%s: not resident (the request asked for a resident file: nothing was staged): %w", rel, syscall.ENODATA)
}

func errResidentPrivate(rel string) error {
	return fmt.Errorf("%s: a resident-only lease is not granted with a private copy (ipc.sharing private: each grant copies the file): %w",
		rel, syscall.ENODATA)
}

func errTooLarge(rel string, need, capacity int64) error {
	return fmt.Errorf("%s: needs %d bytes, more than the capacity of %d: %w", rel, need, capacity, syscall.EFBIG)
}

func errTooManyFDs(rel string, need, budget int) error {
	return fmt.Errorf("%s: needs %d descriptors, more than the budget of %d (RLIMIT_NOFILE less the reserve): %w",
		rel, need, budget, syscall.EFBIG)
}

func errNoSpace(rel string, need int64) error {
	return fmt.Errorf("%s: no room for %d bytes: the rest of the cache is leased or loading: %w", rel, need, syscall.ENOSPC)
}

// ErrRoomWait is wrapped, with ENOSPC, by an acquire whose
// Request.RoomWait passed before room appeared.
var ErrRoomWait = errors.New("the request's bound on the wait for room passed")

func errRoomWaitOver(rel string, need int64, bound time.Duration) error {
	return fmt.Errorf("%s: no room for %d bytes within %s: the rest of the cache is leased or loading: %w: %w",
		rel, need, bound, ErrRoomWait, syscall.ENOSPC)
}

func errYielded(rel string) error {
	return fmt.Errorf("%s: not staged: it yielded to a reader opening it through the mount (staged after that reader closes it): %w",
		rel, syscall.EAGAIN)
}

func errHandingOver(rel string) error {
	return fmt.Errorf("%s: not staged: the cache is being handed over to another daemon: %w", rel, syscall.EAGAIN)
}

func errBusy(rel, why string) error {
	return fmt.Errorf("%s: %s: %w", rel, why, syscall.EBUSY)
}

func errNoDevice(spec, have string) error {
	return fmt.Errorf("no device %q among the staging devices (%s): %w", spec, have, syscall.EINVAL)
}

func errNotStaged(rel string) error {
	return fmt.Errorf("%s: not staged: %w", rel, syscall.ENOENT)
}

// errFileChanged is wrapped by a load that saw its file change under it
// (an event, new attributes, a shorter file): the request retries, and
// answers EAGAIN after maxAttempts.
var errFileChanged = loader.ErrChanged

// maxAttempts bounds the loads one request starts for a file that keeps
// changing (or keeps being evicted) under it.
const maxAttempts = 4

func errKeepsChanging(rel string) error {
	return fmt.Errorf("%s changed (or was evicted) while it was staged, %d times; try again: %w",
		rel, maxAttempts, syscall.EAGAIN)
}
