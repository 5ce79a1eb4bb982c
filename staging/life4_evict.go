package staging

// An entry's life, step 4: it leaves. Eviction (LRU, unleased only; see
// slot.reserveLocked), invalidation (the file changed), an explicit evict,
// or the cache closing. A leased entry is detached at once (no new request
// finds it) and freed by its last Release.

import (
	"fmt"

	"github.com/gdsfs/gdsfs/gpu"
)

// Changed tells the cache that rel was changed through the mount (a
// write, truncation, attribute change, unlink or rename): its entry is
// dropped so no later lease sees the old bytes. It never blocks on a load.
func (c *Cache) Changed(rel string) {
	c.mu.Lock()
	var r gpu.Region
	if e := c.entries[rel]; e != nil {
		r = c.dropLocked(e, "changed through the mount")
		c.stats.invalidations.Add(1)
	}
	c.mu.Unlock()
	freeRegion(r)
}

// Evict drops rel unless it is leased or loading.
func (c *Cache) Evict(rel string) error {
	c.mu.Lock()
	e := c.entries[rel]
	switch {
	case e == nil:
		c.mu.Unlock()
		return errNotStaged(rel)
	case e.leases > 0:
		c.mu.Unlock()
		return errBusy(rel, fmt.Sprintf("%d leases hold it", e.leases))
	case e.state == StateLoading:
		c.mu.Unlock()
		return errBusy(rel, "loading")
	}
	r := c.dropLocked(e, "evicted on request")
	c.stats.evictions.Add(1)
	c.mu.Unlock()
	freeRegion(r)
	return nil
}

// dropLocked detaches e from the map and the LRU. If no lease holds it, its
// reservation is released and its region returned for the caller to free
// after unlocking; otherwise the last Release frees it. Subscribers hear
// that rel is absent, for reason. Cache.mu must be held.
func (c *Cache) dropLocked(e *entry, reason string) gpu.Region {
	if c.entries[e.rel] == e {
		delete(c.entries, e.rel)
		c.emitLocked(e.eventLocked(StateAbsent, reason))
	}
	e.detached = true
	if e.elem != nil {
		e.slot.lru.Remove(e.elem)
		e.elem = nil
	}
	if e.leases > 0 || e.state == StateLoading {
		return nil // freed by the last Release, or by the load's end
	}
	return c.releaseLocked(e)
}

// releaseLocked returns e's reservation to its slot and hands back its
// region. Cache.mu must be held.
func (c *Cache) releaseLocked(e *entry) gpu.Region {
	e.slot.used -= e.reserved
	e.reserved = 0
	r := e.region
	e.region = nil
	if e.state == StateResident {
		e.state = StateAbsent
	}
	return r
}

// detachVictimsLocked removes entries evicted by slot.reserveLocked (their
// reservation is already returned) and hands back their regions for the
// caller to free after unlocking. Cache.mu must be held.
func (c *Cache) detachVictimsLocked(victims []*entry) []gpu.Region {
	var regions []gpu.Region
	for _, v := range victims {
		if c.entries[v.rel] == v {
			delete(c.entries, v.rel)
			c.emitLocked(v.eventLocked(StateAbsent, "evicted"))
		}
		v.detached, v.reserved, v.state = true, 0, StateAbsent
		regions = append(regions, v.region)
		v.region = nil
	}
	c.stats.evictions.Add(uint64(len(victims)))
	return regions
}

func freeRegion(r gpu.Region) {
	if r != nil {
		r.Free()
	}
}
