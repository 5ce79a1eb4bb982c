package staging

// The cache's side of the staging after plain reads (staging/triggers
// .AfterRead, wired in through Config.AfterRead, decides when): the open
// and close of a file through the mount are handed to it, and it stages
// through the cache's API for it (triggers.AfterReadCore): a staging
// after a read is queued and yields to a reader (a new reader through the
// mount cancels its load; one that has the file open holds it back),
// unless a demand joined it.

import (
	"context"
	"os"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/gpu"
	"github.com/gdsfs/gdsfs/staging/triggers"
)

// Reader is what the mount knows of an open for reading: the thread that
// opened the file (the FUSE request's, in the daemon's PID namespace; 0
// when the kernel could not say), the device and inode number a mapping
// of the file made through the mount shows in /proc/PID/maps, and the
// file's size.
type Reader struct {
	PID      uint32
	Dev, Ino uint64
	Size     int64
}

// AfterRead is the staging after plain reads (staging/triggers.AfterRead,
// wired in through Config.AfterRead). Reading, Deferred, Cancel, Stop and
// Open are called with Cache.mu held: its lock is a leaf, and they never
// call the cache.
type AfterRead interface {
	// Attach hands it the cache's API; New calls it once, first.
	Attach(core triggers.AfterReadCore)
	// Opened: rel was opened for reading through the mount; its staging
	// waits for the last close. It never blocks.
	Opened(rel string, r triggers.Reader)
	// Closed: one such open of rel ended. It never blocks.
	Closed(rel string)
	// Reading: a reader has rel open (a staging after a read yields).
	Reading(rel string) bool
	// Deferred: rel's staging waits for its readers (read-ahead leaves it).
	Deferred(rel string) bool
	// Cancel cancels the staging waiting for rel's readers (an explicit
	// evict); whether there was one.
	Cancel(rel string) bool
	// Stop ends the waits and timers (Close).
	Stop()
	// Open is the number of files open through the mount now.
	Open() int
	// Counters are its counters by their stats.json keys (deferred_opens,
	// mapped_read_waits), continued across a hand-over.
	Counters() map[string]*atomic.Uint64
}

var _ triggers.AfterReadCore = (*Cache)(nil)

// afterReadCounters are ar's counters; with ar nil, fresh ones under the
// same keys, so that a predecessor's counts are still shown and handed
// on (a cache without a staging after reads adds nothing to them).
func afterReadCounters(ar AfterRead) map[string]*atomic.Uint64 {
	if ar != nil {
		return ar.Counters()
	}
	return map[string]*atomic.Uint64{"deferred_opens": new(atomic.Uint64), "mapped_read_waits": new(atomic.Uint64)}
}

// openedDeferred hands an open of rel by r to the staging after reads.
// Without one, rel is staged now.
func (c *Cache) openedDeferred(rel string, r Reader) {
	if c.afterRead == nil {
		c.Prefetch(rel)
		return
	}
	c.afterRead.Opened(rel, triggers.Reader(r))
}

// Closed tells the cache that one open of rel through the mount ended;
// after the last, a staging deferred by Opened follows. It never blocks.
func (c *Cache) Closed(rel string) {
	if c.afterRead != nil {
		c.afterRead.Closed(rel)
	}
}

// readingLocked says whether a reader has rel open through the mount.
// Cache.mu must be held.
func (c *Cache) readingLocked(rel string) bool {
	return c.afterRead != nil && c.afterRead.Reading(rel)
}

// deferredLocked says whether rel's staging waits for its readers.
// Cache.mu must be held.
func (c *Cache) deferredLocked(rel string) bool {
	return c.afterRead != nil && c.afterRead.Deferred(rel)
}

// cancelAfterReadLocked cancels the staging deferred for rel's readers,
// and reports whether there was one. Cache.mu must be held (an explicit
// evict).
func (c *Cache) cancelAfterReadLocked(rel string) bool {
	return c.afterRead != nil && c.afterRead.Cancel(rel)
}

// StageAfterRead queues a staging of rel after a read
// (triggers.AfterReadCore); false: dropped.
func (c *Cache) StageAfterRead(rel string) bool { return c.queueLocking(rel, nil, true) }

// CancelYielding cancels rel's stagings after a read still loading that
// no demand joined: a reader opened rel again (triggers.AfterReadCore).
// Each leaves the cache at once ("yielded to a reader"); its region is
// freed by the load's end.
func (c *Cache) CancelYielding(rel string) {
	var free []gpu.Region
	c.lock()
	for _, e := range c.replicasLocked(rel) {
		if e.yielding && e.state == stLoading {
			e.yielding, e.yielded = false, true
			e.ra.Cancel()
			c.stats.yielded.Add(1)
			free = append(free, c.dropLocked(e, "yielded to a reader")) // loading: nil
		}
	}
	c.unlockFree(free...)
}

// Staged says whether rel has an entry, loading or resident
// (triggers.AfterReadCore).
func (c *Cache) Staged(rel string) bool {
	c.lock()
	defer c.unlock()
	return len(c.replicasLocked(rel)) > 0
}

// Done is closed when the cache's context ends: the context New was
// given is done, or Close was called (triggers.AfterReadCore: the
// settling waits end there).
func (c *Cache) Done() <-chan struct{} { return c.ctx.Done() }

// OpenSource opens rel beneath SOURCE as the daemon, a regular file only,
// never blocking (triggers.AfterReadCore).
func (c *Cache) OpenSource(rel string) (*os.File, *unix.Stat_t, error) {
	return c.openRegular(rel, 0)
}

// keepLocked makes a yielding load an ordinary one, because a demand
// depends on it: a reader no longer cancels it, and its tasks no longer
// give way. Cache.mu must be held.
func (e *entry) keepLocked() {
	if e.yielding {
		e.yielding = false
		e.ra.Low.Store(false)
		if e.slot != nil && e.slot.loader != nil {
			e.slot.loader.Signal() // its tasks are no longer capped (staging/loader)
		}
	}
}

// stageYielding stages rel after its readers closed it: a reader opening
// it again through the mount meanwhile cancels the load (errYielded).
func (c *Cache) stageYielding(ctx context.Context, rel string, at uint64) error {
	e, err := c.ensure(ctx, rel, place{yield: true}, false, at)
	if err != nil {
		return err
	}
	c.unpin(e)
	return nil
}
