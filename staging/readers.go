package staging

import (
	"context"
	"time"
)

// Staging waits for the readers. A file opened for reading through the
// mount is staged once the last such open is closed, not while it is read:
// an unmodified loader reading the file through the mount gets the disk
// and the page cache to itself, and the staging that follows reads from
// the page cache it warmed. A lease asks now and is served now; a
// prefetch of any file (.gdsfs/prefetch, warmup, read-ahead of the next
// files) is not held back. A file held open longer than
// staging.defer_limit is staged then (its reader may be done with it
// without closing it). Off: staging.defer_while_read=false.

// readers is what the cache knows of one file's opens through the mount.
// Guarded by Cache.mu.
type readers struct {
	opens    int
	deferred bool        // staging waits for the last close
	timer    *time.Timer // staging.defer_limit
}

// openedDeferred counts an open of rel and defers its staging.
func (c *Cache) openedDeferred(rel string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	r := c.readers[rel]
	if r == nil {
		r = &readers{}
		c.readers[rel] = r
	}
	r.opens++
	r.deferred = true
	c.stats.deferredOpens.Add(1)
	if r.timer == nil && c.opts.DeferLimit > 0 {
		r.timer = time.AfterFunc(c.opts.DeferLimit, func() { c.deferLimit(rel, r) })
	}
	// A staging that followed an earlier reader's close and is still
	// loading yields to this one: left running, it would read the disk
	// alongside the reader (a loader that opens a file to read its header,
	// closes it, and opens it again to read the rest). Staged again after
	// this reader closes it.
	for _, e := range c.replicasLocked(rel) {
		if e.yielding && e.state == StateLoading {
			e.yielding, e.yielded = false, true
			e.ra.cancel()
			c.stats.yielded.Add(1)
			c.dropLocked(e, "yielded to a reader") // loading: its region is freed by the load's end
		}
	}
}

// keepLocked makes a yielding load an ordinary one, because a demand
// depends on it: a reader no longer cancels it, and its tasks no longer
// give way. Cache.mu must be held.
func (e *entry) keepLocked() {
	if e.yielding {
		e.yielding = false
		e.ra.low.Store(false)
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

// Closed tells the cache that one open of rel through the mount ended;
// after the last, a staging deferred by Opened is queued. It never blocks.
func (c *Cache) Closed(rel string) {
	c.mu.Lock()
	r := c.readers[rel]
	if r == nil {
		c.mu.Unlock()
		return
	}
	r.opens--
	if r.opens > 0 {
		c.mu.Unlock()
		return
	}
	delete(c.readers, rel)
	if r.timer != nil {
		r.timer.Stop()
	}
	c.mu.Unlock()
	if r.deferred {
		c.queueLocking(prefetchReq{rel: rel, afterRead: true})
	}
}

// deferLimit stages rel, still open after staging.defer_limit.
func (c *Cache) deferLimit(rel string, r *readers) {
	c.mu.Lock()
	current := c.readers[rel] == r
	deferred := current && r.deferred
	if current {
		r.deferred, r.timer = false, nil
	}
	c.mu.Unlock()
	if deferred {
		c.Prefetch(rel)
	}
}

// stopReadersLocked stops the timers; Cache.mu must be held (Close).
func (c *Cache) stopReadersLocked() {
	for _, r := range c.readers {
		if r.timer != nil {
			r.timer.Stop()
		}
	}
	c.readers = map[string]*readers{}
}
