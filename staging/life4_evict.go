package staging

// An entry's life, step 4: it leaves. Eviction (LRU, unleased only; see
// reserveLocked), invalidation (the file changed), an explicit evict,
// or the cache closing. A leased entry is detached at once (no new request
// finds it) and freed by its last Release.

import (
	"fmt"
	"slices"
	"strings"

	"go.uber.org/zap"

	"github.com/gdsfs/gdsfs/gpu"
)

// Changed tells the cache that rel was changed through the mount (a
// write, truncation, attribute change, unlink or rename): its entry is
// dropped so no later lease sees the old bytes. It never blocks on a load.
func (c *Cache) Changed(rel string) {
	c.ra.Changed(rel) // its directory is listed again when next needed
	c.lock()
	var free []gpu.Region
	for _, e := range c.replicasLocked(rel) {
		free = append(free, c.dropLocked(e, "changed through the mount"))
		c.stats.invalidations.Add(1)
	}
	c.unlockFree(free...)
}

// changedFID handles a change event: the entries of that file are
// dropped, and a load in flight will not publish (a write seen during or
// after a load invalidates it). Called by the watcher, Cache.mu not held.
func (c *Cache) changedFID(id fid) {
	c.lock()
	var free []gpu.Region
	for e := range c.byFID[id] {
		c.stats.changeEvents.Add(1)
		c.ra.Changed(e.rel)
		free = append(free, c.invalidateLocked(e, "modified (change event)"))
	}
	c.unlockFree(free...)
}

// changedAll drops every entry that relies on change events: some were
// lost.
func (c *Cache) changedAll() {
	c.lock()
	var free []gpu.Region
	for _, set := range c.byFID {
		for e := range set {
			free = append(free, c.invalidateLocked(e, "change events lost"))
		}
	}
	c.unlockFree(free...)
}

// invalidateLocked marks a loading e changed (it will not publish) or
// drops it, returning the region to free after unlocking. Cache.mu must
// be held.
func (c *Cache) invalidateLocked(e *entry, reason string) gpu.Region {
	if e.state == stLoading {
		e.changed = true
		return nil
	}
	c.stats.invalidations.Add(1)
	return c.dropLocked(e, reason)
}

// indexLocked lets change events find e. Cache.mu must be held.
func (c *Cache) indexLocked(e *entry) {
	if !e.events {
		return
	}
	set := c.byFID[e.fid]
	if set == nil {
		set = map[*entry]struct{}{}
		c.byFID[e.fid] = set
	}
	set[e] = struct{}{}
}

// unindexLocked: events no longer concern e (detached). Cache.mu must be
// held.
func (c *Cache) unindexLocked(e *entry) {
	if set := c.byFID[e.fid]; set != nil {
		delete(set, e)
		if len(set) == 0 {
			delete(c.byFID, e.fid)
		}
	}
}

// Evict drops rel's replicas unless they are leased or loading.
func (c *Cache) Evict(rel string) error { return c.EvictOn(rel, nil) }

// EvictOn drops rel's replicas on the devices devs names (none: on every
// device), each unless it is leased or loading: those stay, and the
// answer is then EBUSY naming them (the others were dropped). Named for
// every device (none named, "all", or each one) it also cancels the
// staging that waits for rel's readers (readers.go: after the last close
// through the mount, or after a reader is done with its mapping), which
// would otherwise stage the file again after it was evicted. A file with
// no replica there and no such staging is ENOENT.
func (c *Cache) EvictOn(rel string, devs []string) error {
	on, err := c.slotsFor(devs)
	if err != nil {
		return err
	}
	c.lock()
	var free []gpu.Region
	var busy []string
	found := (len(on) == 0 || len(on) == len(c.slots)) && c.cancelAfterReadLocked(rel)
	for _, e := range c.replicasLocked(rel) {
		if len(on) > 0 && !slices.Contains(on, e.slot) {
			continue
		}
		found = true
		switch {
		case e.heldLocked():
			busy = append(busy, fmt.Sprintf("on %s %d leases and %d requests hold it", e.slot.dev.Name(), e.leases, e.pins))
		case e.state == stLoading:
			busy = append(busy, "loading on "+e.slot.dev.Name())
		default:
			free = append(free, c.dropLocked(e, "evicted on request"))
			c.stats.evictions.Add(1)
			e.slot.evictions.Add(1)
		}
	}
	c.unlockFree(free...)
	switch {
	case !found:
		return errNotStaged(rel)
	case len(busy) > 0:
		return errBusy(rel, strings.Join(busy, "; "))
	}
	return nil
}

// dropLocked detaches e from the map and the LRU. If no lease holds it, its
// reservation is released and its region returned for the caller to free
// after unlocking; otherwise the last Release frees it. Subscribers hear
// that rel is absent, for reason. Cache.mu must be held.
func (c *Cache) dropLocked(e *entry, reason string) gpu.Region {
	if c.unattachLocked(e) {
		c.leftLocked(e)
		c.emitLocked(e.eventLocked(stAbsent, reason))
	}
	e.detached = true
	c.unindexLocked(e)
	if e.elem != nil {
		e.slot.lru.Remove(e.elem)
		e.elem = nil
	}
	if e.heldLocked() || e.state == stLoading {
		return nil // freed by the last Release or unpin, or by the load's end
	}
	return c.releaseLocked(e)
}

// unpinLocked ends one request's hold on e, and returns e's region for
// the caller to free when that was the last hold of a detached entry.
// Cache.mu must be held.
func (c *Cache) unpinLocked(e *entry) gpu.Region {
	e.pins--
	c.wakeLocked() // evictable now, perhaps
	if e.detached && !e.heldLocked() && e.state != stLoading {
		return c.releaseLocked(e)
	}
	return nil
}

// unpin is unpinLocked for a caller without the lock.
func (c *Cache) unpin(e *entry) {
	c.lock()
	r := c.unpinLocked(e)
	c.unlockFree(r)
}

// releaseLocked returns e's reservation to its slot and hands back its
// region. Cache.mu must be held.
func (c *Cache) releaseLocked(e *entry) gpu.Region {
	e.slot.used -= e.reserved
	c.fdsUsed -= e.fds
	e.reserved, e.fds = 0, 0
	c.wakeLocked()
	r := e.region
	e.region = nil
	if e.state == stResident {
		e.moveLocked(stAbsent)
	}
	return r
}

// detachVictimsLocked removes entries evicted by reserveLocked (their
// reservation is already returned) and hands back their regions for the
// caller to free after unlocking. Cache.mu must be held.
func (c *Cache) detachVictimsLocked(victims []*entry) []gpu.Region {
	var regions []gpu.Region
	for _, v := range victims {
		v.slot.evictions.Add(1)
		if c.unattachLocked(v) {
			c.leftLocked(v)
			c.emitLocked(v.eventLocked(stAbsent, "evicted"))
		}
		v.detached, v.reserved, v.fds = true, 0, 0
		v.moveLocked(stAbsent)
		c.unindexLocked(v)
		regions = append(regions, v.region)
		v.region = nil
	}
	c.stats.evictions.Add(uint64(len(victims)))
	return regions
}

// unlockFree releases Cache.mu and then frees rs (nil ones: nothing): the
// regions the books let go of under the lock leave device memory after
// it, never with it held. Every such release goes through here.
func (c *Cache) unlockFree(rs ...gpu.Region) {
	c.unlock()
	c.freeRegions(rs)
}

// freeRegions frees each of rs (nil ones: nothing).
func (c *Cache) freeRegions(rs []gpu.Region) {
	for _, r := range rs {
		c.freeRegion(r)
	}
}

// freeRegion frees r (nil: nothing). A failure is logged and counted
// (free_errors): the device may hold memory the cache no longer counts.
func (c *Cache) freeRegion(r gpu.Region) {
	if r == nil {
		return
	}
	if err := r.Free(); err != nil {
		c.stats.freeErrors.Add(1)
		c.log.Error("free region", zap.Int64("bytes", r.Size()), zap.Error(err))
	}
}
