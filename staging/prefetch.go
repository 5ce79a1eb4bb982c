package staging

import "go.uber.org/zap"

// Prefetch queues rel for staging. It drops the request (and returns
// false) when the queue is full, and ignores a path already queued.
func (c *Cache) Prefetch(rel string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return false
	}
	if c.queued[rel] {
		return true
	}
	select {
	case c.queue <- rel:
		c.queued[rel] = true
		c.stats.prefetches.Add(1)
		return true
	default:
		c.stats.prefetchDropped.Add(1)
		return false
	}
}

func (c *Cache) prefetchWorker() {
	defer c.wg.Done()
	for {
		select {
		case <-c.ctx.Done():
			return
		case rel := <-c.queue:
			// rel stays in queued until staged, so a queued file never
			// reads as absent and is not queued twice meanwhile.
			_, err := c.stage(c.ctx, rel, false)
			if err != nil {
				c.log.Debug("prefetch", zap.String("path", rel), zap.Error(err))
			}
			c.mu.Lock()
			delete(c.queued, rel)
			if err != nil && c.entries[rel] == nil {
				// It read as loading while queued; say it is not (no
				// entry was made, so no other event says so).
				c.emitLocked(Event{Rel: rel, State: StateAbsent, Err: err, Reason: "not staged: " + err.Error()})
			}
			c.mu.Unlock()
			if c.hooks.prefetchDone != nil {
				c.hooks.prefetchDone(rel)
			}
		}
	}
}
