package staging

// An entry's life, step 3: the load's end becomes visible. A resident
// entry joins its slot's LRU and is handed out from then on; a failed one
// keeps its reason until the next request retries it. Waiters wake and
// subscribers hear of it.

import (
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/gdsfs/gdsfs/gpu"
)

// publish records the end of e's load and wakes its waiters. Subscribers
// hear resident or failed, unless the entry was dropped while it loaded
// (they heard absent then). A background load nobody joined ends in
// publishBackgroundLocked (background.go).
func (c *Cache) publish(e *entry, region gpu.Region, path, note string, err error, dur time.Duration) {
	var free gpu.Region
	c.lock()
	if err == nil && e.changed {
		err = fmt.Errorf("a change event came: %w", errFileChanged)
	}
	e.path, e.loadDur = path, dur
	ahead, yielded := e.bg != nil, e.yielded
	switch {
	case ahead:
		free = c.publishBackgroundLocked(e, region, note, err)
	case yielded && err != nil: // cancelled for a reader (readers.go): not a load error
		e.moveLocked(stFailed)
		e.reason, e.err = "yielded to a reader", errYielded(e.rel)
		free = region
		c.releaseLocked(e)
	case err != nil:
		e.moveLocked(stFailed)
		e.reason, e.err = err.Error(), fmt.Errorf("stage %s: %w", e.rel, err)
		free = region
		c.releaseLocked(e)
		c.stats.loadErrors.Add(1)
		if !e.detached {
			c.emitLocked(e.eventLocked(stFailed, ""))
		}
	case e.detached && e.heldLocked():
		e.region = region // the last unpin frees it
	case e.detached:
		free = region
		c.releaseLocked(e)
	default:
		c.residentLocked(e, region, note)
	}
	close(e.done)
	c.wakeLocked() // resident: evictable once unleased
	c.published++
	seq := c.published
	c.unlockFree(free)
	if e.ra != nil {
		e.ra.Cancel() // the load is over: release its context
	}
	switch {
	case err != nil && ahead:
		c.log.Debug("background load ended", zap.String("path", e.rel), zap.Error(err))
	case err != nil && yielded:
		c.log.Debug("staging yielded to a reader", zap.String("path", e.rel))
	case err != nil:
		c.log.Warn("load failed", zap.String("path", e.rel), zap.Error(err))
	default:
		c.log.Debug("staged", zap.String("path", e.rel), zap.String("load_path", path),
			zap.Int64("bytes", e.id.size), zap.Duration("took", dur), zap.Bool("read_ahead", ahead),
			zap.Uint64("seq", seq)) // the order loads ended in: log lines of loads ending together may be written out of it
	}
}

// residentLocked makes e resident with region: it joins its slot's LRU.
// Cache.mu must be held.
func (c *Cache) residentLocked(e *entry, region gpu.Region, note string) {
	e.moveLocked(stResident)
	e.reason, e.region = note, region
	e.elem = e.slot.lru.PushFront(e)
	c.stats.addBytes(e.path, e.id.size-e.peerBytes)
	c.stats.bytesPeer.Add(uint64(e.peerBytes))
	e.slot.bytesRead.Add(uint64(e.id.size - e.peerBytes))
	if e.path == PathCuFile {
		e.slot.bytesCuFile.Add(uint64(e.id.size - e.peerBytes))
	}
	e.slot.bytesPeer.Add(uint64(e.peerBytes))
	c.emitLocked(e.eventLocked(stResident, note))
}
