package fs

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// Every file or directory open through the mount holds a descriptor in
// the daemon (the backing file), and so does every file the mount keeps
// after an unlink or rename over it (replaced.go). Without a bound one
// caller could use up RLIMIT_NOFILE and leave every other user, root and
// the lease socket failing with EMFILE. So each uid may hold at most
// fuse.max_open_per_uid open handles; past that its opens fail with
// EMFILE, for that uid only. The daemon's own uid (root, for a root
// daemon) is not bounded: it can stop the daemon anyway, and it must be
// able to look at a mount whose users sit at their bound.
//
// Kept files are bounded by the same number, for all uids together: past
// it an unlinked file is simply not kept (a racing open of it then fails
// with ENOENT, as on a filesystem without that nicety).
//
// The bound is a share of the descriptors the staging cache leaves out of
// its budget (staging/fdbudget.go: a quarter of the limit, at least 512):
// auto is a quarter of that share, and a set value may be at most half of
// it.

// minFDReserve and fdReserve repeat staging's split of RLIMIT_NOFILE.
const minFDReserve = 512

func fdReserve(limit uint64) int {
	limit = min(limit, 1<<24) // RLIM_INFINITY and other absurdities
	return min(int(limit), max(minFDReserve, int(limit/4)))
}

// noFile is the soft RLIMIT_NOFILE (the daemon raised it to the hard one
// before mounting).
func noFile() (uint64, error) {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
		return 0, fmt.Errorf("getrlimit(RLIMIT_NOFILE): %w", err)
	}
	return rl.Cur, nil
}

// OpenPerUID is the per-uid bound for a descriptor limit: fuse.max_open_per_uid,
// or for auto a quarter of the reserve (at least 1). A set value above
// half of the reserve is an error naming the key.
func (o *Options) OpenPerUID(limit uint64) (int, error) {
	reserve := fdReserve(limit)
	if o.MaxOpenPerUID.Auto() {
		return max(1, reserve/4), nil
	}
	if n := int(o.MaxOpenPerUID); n > reserve/2 {
		return 0, fmt.Errorf("fuse.max_open_per_uid: %d is more than half of the %d descriptors the daemon keeps outside staging (RLIMIT_NOFILE %d): one uid could lock every other user out; use auto (%d) or at most %d",
			n, reserve, limit, max(1, reserve/4), reserve/2)
	}
	return int(o.MaxOpenPerUID), nil
}

// refusalLogEvery is how often a uid's refused opens are logged at most.
const refusalLogEvery = time.Minute

// fdBudget counts the descriptors callers make the daemon hold.
type fdBudget struct {
	perUID int    // the bound; fixed at Mount
	exempt uint32 // the daemon's own uid
	log    *zap.Logger

	mu     sync.Mutex
	open   map[uint32]int       // open handles per bounded uid; guarded by mu; INVARIANT: 0 < open[uid] <= perUID
	kept   int                  // kept files (replaced.go); guarded by mu; INVARIANT: 0 <= kept <= perUID
	logged map[uint32]time.Time // when each uid's refusal was last logged; guarded by mu

	refused atomic.Uint64 // opens refused at the bound
	notKept atomic.Uint64 // files not kept at the bound
}

// charge is one open handle counted against a uid; its release gives it
// back once.
type charge struct {
	b    *fdBudget
	uid  uint32
	done atomic.Bool
}

// take charges an open by the caller in ctx, or answers EMFILE when the
// caller's uid holds its bound. Nothing is charged for the daemon's own
// uid, nor for a request without a caller (the kernel sends one with
// every open).
func (b *fdBudget) take(ctx context.Context) (*charge, syscall.Errno) {
	c, ok := fuse.FromContext(ctx)
	if !ok || c.Uid == b.exempt {
		return nil, 0
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.open[c.Uid] >= b.perUID {
		b.refused.Add(1)
		if t, seen := b.logged[c.Uid]; !seen || time.Since(t) >= refusalLogEvery {
			if len(b.logged) >= 4096 {
				clear(b.logged)
			}
			b.logged[c.Uid] = time.Now()
			b.log.Warn("open refused (EMFILE): the uid holds fuse.max_open_per_uid files open through the mount",
				zap.Uint32("uid", c.Uid), zap.Int("max_open_per_uid", b.perUID), zap.Uint32("pid", c.Pid))
		}
		return nil, syscall.EMFILE
	}
	b.open[c.Uid]++
	return &charge{b: b, uid: c.Uid}, 0
}

// adopt charges a handle a predecessor daemon opened for uid, bound or
// not: the file is open already.
func (b *fdBudget) adopt(uid uint32) *charge {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.open[uid]++
	return &charge{b: b, uid: uid}
}

// release gives the charge back (once; nil is no charge).
func (c *charge) release() {
	if c == nil || c.done.Swap(true) {
		return
	}
	b := c.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.open[c.uid]--; b.open[c.uid] <= 0 {
		delete(b.open, c.uid)
	}
}

// keep reports whether one more file may be kept, counting it if so.
func (b *fdBudget) keep() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.kept >= b.perUID {
		b.notKept.Add(1)
		return false
	}
	b.kept++
	return true
}

// unkeep gives back a kept file's count.
func (b *fdBudget) unkeep() {
	b.mu.Lock()
	b.kept--
	b.mu.Unlock()
}
