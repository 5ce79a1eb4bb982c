package staging

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/gdsfs/gdsfs/gpu"
)

// ensure returns rel's resident entry, loading it if needed. Concurrent
// callers for one file share one load (single flight); each waits bounded
// by its own ctx, while the load itself belongs to the cache.
func (c *Cache) ensure(ctx context.Context, rel string) (*entry, error) {
	for attempt := 0; ; attempt++ {
		f, id, err := c.openEligible(rel)
		if err != nil {
			c.checkIdentity(rel) // a vanished or changed file loses its entry
			return nil, err
		}
		e, err := c.lookupOrStart(rel, id, f)
		if err != nil {
			return nil, err
		}
		select {
		case <-e.done:
		case <-ctx.Done():
			return nil, fmt.Errorf("stage %s: %w", rel, ctx.Err())
		}
		c.mu.Lock()
		state, lerr, detached := e.state, e.err, e.detached
		c.mu.Unlock()
		switch {
		case state == StateResident && !detached:
			return e, nil
		case state == StateFailed && !detached:
			return nil, lerr
		case attempt >= 3:
			return nil, errBusy(rel, "changed or evicted again and again while staging")
		}
		// Evicted or invalidated between the load's end and now: again.
	}
}

// openEligible opens rel and checks that it is a regular file that the
// options let through.
func (c *Cache) openEligible(rel string) (*os.File, identity, error) {
	if why := c.filter.why(rel); why != "" {
		return nil, identity{}, errNotEligible(rel, why)
	}
	f, err := c.open(rel, os.O_RDONLY)
	if err != nil {
		return nil, identity{}, err
	}
	id, mode, err := fileIdentity(f)
	switch {
	case err != nil:
	case mode&syscall.S_IFMT != syscall.S_IFREG:
		err = errNotEligible(rel, "not a regular file")
	case id.size < int64(c.opts.MinFileSize):
		err = errNotEligible(rel, fmt.Sprintf("smaller than staging.min_file_size (%s)", c.opts.MinFileSize))
	}
	if err != nil {
		f.Close()
		return nil, identity{}, err
	}
	return f, id, nil
}

// lookupOrStart returns the entry for (rel, id): an existing resident or
// loading one, or a new one whose load it starts with f. It takes f: f is
// closed unless a load uses it.
func (c *Cache) lookupOrStart(rel string, id identity, f *os.File) (*entry, error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		f.Close()
		return nil, fmt.Errorf("stage %s: cache closed", rel)
	}
	var stale gpu.Region
	if e := c.entries[rel]; e != nil {
		switch {
		case e.id != id:
			stale = c.dropLocked(e)
			c.stats.invalidations.Add(1)
		case e.state == StateResident:
			e.slot.lru.MoveToFront(e.elem)
			c.stats.hits.Add(1)
			c.mu.Unlock()
			f.Close()
			return e, nil
		case e.state == StateLoading:
			c.stats.sharedLoads.Add(1)
			c.mu.Unlock()
			f.Close()
			return e, nil
		default: // failed: retry
			c.dropLocked(e)
		}
	}
	e, victims, err := c.startLocked(rel, id)
	if err == nil {
		c.wg.Add(1)
	}
	c.mu.Unlock()
	freeRegion(stale)
	for _, r := range victims {
		freeRegion(r)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	go c.load(e, f)
	return e, nil
}

// startLocked creates a loading entry on the slot with the most room,
// evicting as needed. It returns the evicted regions for the caller to free
// after unlocking. Cache.mu must be held.
func (c *Cache) startLocked(rel string, id identity) (*entry, []gpu.Region, error) {
	best := c.slots[0]
	for _, s := range c.slots[1:] {
		if s.capacity-s.used+s.evictableLocked() > best.capacity-best.used+best.evictableLocked() {
			best = s
		}
	}
	need := best.need(id.size, int64(c.opts.ChunkSize))
	if need > best.capacity {
		c.stats.tooLarge.Add(1)
		return nil, nil, errTooLarge(rel, need, best.capacity)
	}
	victims, ok := best.reserveLocked(need)
	if !ok {
		c.stats.noSpace.Add(1)
		return nil, nil, errNoSpace(rel, need)
	}
	regions := c.detachVictimsLocked(victims)
	c.stats.misses.Add(1)
	c.gen++
	e := &entry{
		rel: rel, id: id, slot: best, gen: c.gen, done: make(chan struct{}),
		state: StateLoading, reserved: need,
	}
	c.entries[rel] = e
	return e, regions, nil
}

// load fills e from f and publishes the result.
func (c *Cache) load(e *entry, f *os.File) {
	defer c.wg.Done()
	defer f.Close()
	start := time.Now()
	region, err := c.alloc(e)
	path, note := "", ""
	if err == nil {
		path, note, err = c.fill(e, f, region)
	}
	if err == nil {
		if now, _, ferr := fileIdentity(f); ferr != nil || now != e.id {
			err = fmt.Errorf("%s changed while it was loading", e.rel)
		}
	}
	if err == nil {
		err = region.Seal()
	}
	dur := time.Since(start)
	c.publish(e, region, path, note, err, dur)
}

// publish records the end of e's load and wakes its waiters.
func (c *Cache) publish(e *entry, region gpu.Region, path, note string, err error, dur time.Duration) {
	var free gpu.Region
	c.mu.Lock()
	e.path, e.loadDur = path, dur
	switch {
	case err != nil:
		e.state, e.reason, e.err = StateFailed, err.Error(), fmt.Errorf("stage %s: %w", e.rel, err)
		free = region
		c.releaseLocked(e)
		c.stats.loadErrors.Add(1)
	case e.detached:
		free = region
		c.releaseLocked(e)
	default:
		e.state, e.reason, e.region = StateResident, note, region
		e.elem = e.slot.lru.PushFront(e)
		c.stats.addBytes(path, e.id.size)
	}
	close(e.done)
	c.mu.Unlock()
	freeRegion(free)
	if err != nil {
		c.log.Warn("load failed", zap.String("path", e.rel), zap.Error(err))
	} else {
		c.log.Debug("staged", zap.String("path", e.rel), zap.String("load_path", path),
			zap.Int64("bytes", e.id.size), zap.Duration("took", dur))
	}
}

// alloc allocates e's region. When the device is out of memory (other
// processes use it too), it evicts unleased entries of e's slot one by one
// and tries again.
func (c *Cache) alloc(e *entry) (gpu.Region, error) {
	for {
		r, err := e.slot.dev.Alloc(e.id.size)
		if err == nil || !errors.Is(err, gpu.ErrOutOfMemory) {
			return r, err
		}
		c.mu.Lock()
		var victim *entry
		for el := e.slot.lru.Back(); el != nil && victim == nil; el = el.Prev() {
			if v := el.Value.(*entry); v.leases == 0 {
				victim = v
			}
		}
		var vr gpu.Region
		if victim != nil {
			vr = c.dropLocked(victim)
			c.stats.evictions.Add(1)
		}
		c.mu.Unlock()
		if victim == nil {
			return nil, err
		}
		freeRegion(vr)
	}
}
