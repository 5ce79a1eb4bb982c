package staging

import (
	"strings"

	"go.uber.org/zap"
)

// prefetchReq is one queued staging: a path and, optionally, the devices
// to stage it on (a prefetch line's gpus=).
type prefetchReq struct {
	rel string
	on  []*slot // nil: wherever staging puts it
	// afterRead: queued by the last close of a plain read (readers.go);
	// its load yields to a new reader.
	afterRead bool
}

// key identifies the request for duplicates: the path, the devices,
// and whether it is a staging after a read (which yields to a reader: a
// prefetch is never merged into one).
func (r prefetchReq) key() string {
	var b strings.Builder
	b.WriteString(r.rel)
	for _, s := range r.on {
		b.WriteByte(0)
		b.WriteString(s.dev.Name())
	}
	if r.afterRead {
		b.WriteString("\x00after read")
	}
	return b.String()
}

// Prefetch queues rel for staging. It drops the request (and returns
// false) when the queue is full, and ignores a path already queued.
func (c *Cache) Prefetch(rel string) bool {
	return c.queueLocking(prefetchReq{rel: rel})
}

// PrefetchOn queues rel for staging on each device devs names ("all",
// ordinals, names), as StageOn stages it. An unknown device is EINVAL;
// false: the queue is full (the request was dropped).
func (c *Cache) PrefetchOn(rel string, devs []string) (bool, error) {
	on, err := c.slotsFor(devs)
	if err != nil {
		return false, err
	}
	return c.queueLocking(prefetchReq{rel: rel, on: on}), nil
}

// queueLocking queues r unless the same request is queued already.
func (c *Cache) queueLocking(r prefetchReq) bool {
	c.lock()
	defer c.unlock()
	return c.queuePrefetchLocked(r)
}

// queuePrefetchLocked is queueLocking with Cache.mu held.
func (c *Cache) queuePrefetchLocked(r prefetchReq) bool {
	if c.closed {
		return false
	}
	k := r.key()
	if c.queuedKeys[k] {
		return true
	}
	select {
	case c.queue <- r:
		c.queuedKeys[k] = true
		c.queued[r.rel]++
		if len(r.on) > 0 {
			c.queuedOn[r.rel]++
		}
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
		case r := <-c.queue:
			// r stays queued until staged, so a queued file never reads
			// as absent and is not queued twice meanwhile.
			var err error
			if r.afterRead {
				err = c.stageYielding(c.ctx, r.rel, c.ra.Tick())
			} else {
				_, err = c.stageOn(c.ctx, r.rel, r.on, false, c.ra.Tick())
			}
			if err != nil {
				c.log.Debug("prefetch", zap.String("path", r.rel), zap.Error(err))
			}
			c.lock()
			delete(c.queuedKeys, r.key())
			decrement(c.queued, r.rel)
			if len(r.on) > 0 {
				decrement(c.queuedOn, r.rel)
			}
			switch {
			case err != nil && c.entries[r.rel] == nil && c.queued[r.rel] == 0:
				// It read as loading while queued; say it is not (no
				// entry was made, so no other event says so).
				c.emitLocked(Event{Rel: r.rel, State: StateAbsent, Err: err, Reason: "not staged: " + err.Error()})
			case len(r.on) > 0 && c.queuedOn[r.rel] == 0:
				// Attr read loading while replicas asked for were queued,
				// even with one resident: say what it reads now (a waiter
				// woken by the last replica's event may have read it
				// before this). No Duration: not a load.
				state, path := c.attrLocked(r.rel)
				c.emitLocked(Event{Rel: r.rel, State: state, LoadPath: path, Reason: "replicas asked for are staged"})
			}
			c.unlock()
			if c.hooks.prefetchDone != nil {
				c.hooks.prefetchDone(r.rel)
			}
		}
	}
}

// decrement counts one less of k, forgetting it at zero.
func decrement(m map[string]int, k string) {
	if m[k]--; m[k] <= 0 {
		delete(m, k)
	}
}
