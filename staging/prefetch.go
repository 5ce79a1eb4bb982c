package staging

import (
	"context"
)

// Queue is the prefetch queue the cache feeds (staging/triggers.Queue,
// wired in through Config.Queue): .gdsfs/prefetch and warmup through
// Prefetch and PrefetchOn, the open trigger, and the staging after
// reads (readers.go). The cache keeps which paths are queued, so that
// Attr reads a queued file as loading and the end of a request is told
// in order with the state events; the queue keeps the requests, drops
// duplicates and runs the workers.
type Queue interface {
	// Offer queues a request (devices by name; none: wherever staging
	// puts it) unless the same is queued (ok, not added); ok false: full,
	// dropped. Called with Cache.mu held: it must never call the cache.
	Offer(rel string, on []string, afterRead bool) (ok, added bool)
	// Len counts the requests queued or being staged.
	Len() int
	// Run starts the workers until ctx is done: each stages a request
	// with stage, then calls done; done calls forget with Cache.mu held.
	Run(ctx context.Context,
		stage func(ctx context.Context, rel string, on []string, afterRead bool) error,
		done func(rel string, on []string, afterRead bool, err error, forget func()))
	// Wait returns once the workers have stopped.
	Wait()
}

// Prefetch queues rel for staging. It drops the request (and returns
// false) when the queue is full, and ignores a path already queued.
func (c *Cache) Prefetch(rel string) bool {
	return c.queueLocking(rel, nil, false)
}

// PrefetchOn queues rel for staging on each device devs names ("all",
// ordinals, names), as StageOn stages it. An unknown device is EINVAL;
// false: the queue is full (the request was dropped).
func (c *Cache) PrefetchOn(rel string, devs []string) (bool, error) {
	on, err := c.slotsFor(devs)
	if err != nil {
		return false, err
	}
	return c.queueLocking(rel, on, false), nil
}

// queueLocking queues a request unless the same one is queued already.
func (c *Cache) queueLocking(rel string, on []*slot, afterRead bool) bool {
	c.lock()
	defer c.unlock()
	return c.queuePrefetchLocked(rel, on, afterRead)
}

// queuePrefetchLocked is queueLocking with Cache.mu held. Without a
// queue (Config.Queue nil) every request is dropped.
func (c *Cache) queuePrefetchLocked(rel string, on []*slot, afterRead bool) bool {
	if c.closed {
		return false
	}
	ok, added := false, false
	if c.queue != nil {
		ok, added = c.queue.Offer(rel, slotNames(on), afterRead)
	}
	switch {
	case added:
		c.queued[rel]++
		if len(on) > 0 {
			c.queuedOn[rel]++
		}
		c.stats.prefetches.Add(1)
	case !ok:
		c.stats.prefetchDropped.Add(1)
	}
	return ok
}

// slotNames names the devices of on (nil for none).
func slotNames(on []*slot) []string {
	var names []string
	for _, s := range on {
		names = append(names, s.dev.Name())
	}
	return names
}

// stageQueued stages a request the queue's worker took.
func (c *Cache) stageQueued(ctx context.Context, rel string, on []string, afterRead bool) error {
	if afterRead {
		return c.stageYielding(ctx, rel, c.ra.Tick())
	}
	slots, err := c.slotsFor(on)
	if err != nil {
		return err
	}
	_, err = c.stageOn(ctx, rel, slots, false, c.ra.Tick())
	return err
}

// queuedDone ends a request: it stops counting as queued (forget, under
// Cache.mu with the cache's own count), and what Attr reads of it now is
// told when the request alone made it read as loading.
func (c *Cache) queuedDone(rel string, on []string, _ bool, err error, forget func()) {
	c.lock()
	forget()
	decrement(c.queued, rel)
	if len(on) > 0 {
		decrement(c.queuedOn, rel)
	}
	switch {
	case err != nil && c.entries[rel] == nil && c.queued[rel] == 0:
		// It read as loading while queued; say it is not (no entry was
		// made, so no other event says so).
		c.emitLocked(Event{Rel: rel, State: StateAbsent, Err: err, Reason: "not staged: " + err.Error()})
	case len(on) > 0 && c.queuedOn[rel] == 0:
		// Attr read loading while replicas asked for were queued, even
		// with one resident: say what it reads now (a waiter woken by the
		// last replica's event may have read it before this). No
		// Duration: not a load.
		state, path := c.attrLocked(rel)
		c.emitLocked(Event{Rel: rel, State: state, LoadPath: path, Reason: "replicas asked for are staged"})
	}
	c.unlock()
	if c.hooks.prefetchDone != nil {
		c.hooks.prefetchDone(rel)
	}
}

// decrement counts one less of k, forgetting it at zero.
func decrement(m map[string]int, k string) {
	if m[k]--; m[k] <= 0 {
		delete(m, k)
	}
}
