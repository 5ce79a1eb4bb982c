package staging

// The cache's API for the triggers that load files nobody asked for
// (triggers.Core; the read-ahead executor, staging/triggers/readahead,
// is its caller): loads at background priority, cancelled by their
// trigger and promoted by the first demand that meets them; the victim
// choice the trigger makes for them; and what becomes of them, told to
// the trigger under Cache.mu in the order of the entry's events, before
// subscribers get the event.

import (
	"context"
	"errors"
	"fmt"

	"github.com/gdsfs/gdsfs/gpu"
	"github.com/gdsfs/gdsfs/staging/loader"
	"github.com/gdsfs/gdsfs/staging/triggers"
)

var _ triggers.Core = (*Cache)(nil)

// Go runs f on a goroutine Close waits for; false (f not run): the cache
// is closed.
func (c *Cache) Go(f func()) bool {
	c.lock()
	closed := c.closed
	if !closed {
		c.wg.Add(1)
	}
	c.unlock()
	if closed {
		return false
	}
	go func() {
		defer c.wg.Done()
		f()
	}()
	return true
}

// CancelBackground cancels rel's background loads in flight that no
// demand promoted: each leaves the cache at once (absent, for reason);
// its region is freed when the load stops.
func (c *Cache) CancelBackground(rel, reason string) {
	var free []gpu.Region
	c.lock()
	for _, e := range c.replicasLocked(rel) {
		if e.bg != nil && e.state == stLoading {
			e.ra.Cancel()
			free = append(free, c.dropLocked(e, reason))
		}
	}
	c.unlockFree(free...)
}

// StartBackground opens b.Rel as the daemon and, if the cache takes it,
// starts its load at background priority (triggers.Core).
func (c *Cache) StartBackground(b triggers.Background) triggers.Outcome {
	if c.stagedAlready(b.Rel) {
		return triggers.Staged
	}
	o, err := c.openEligible(b.Rel)
	if err != nil {
		return triggers.NotStaged
	}
	c.lock()
	e, regions, out := c.startBackgroundLocked(b, o)
	if e != nil {
		c.wg.Add(1) // the load's c.wg.Done ends it
	}
	c.unlockFree(regions...)
	if e == nil {
		o.f.Close()
		return out
	}
	go c.load(e, o.f)
	return triggers.Started
}

// stagedAlready says whether a background load of rel has nothing to do:
// a replica is loading, or one is resident and its file unchanged: the
// file's identity now (identityNow: no open for reading) is the
// replica's. Change events do not spare the look: they tell of the staged
// inode's bytes changing, not of another file renamed over rel.
func (c *Cache) stagedAlready(rel string) bool {
	c.lock()
	reps := c.replicasLocked(rel)
	for _, e := range reps {
		if e.state == stLoading {
			c.unlock()
			return true
		}
	}
	c.unlock()
	if len(reps) == 0 {
		return false
	}
	id, err := c.identityNow(rel)
	if err != nil {
		return false // the open says what is wrong
	}
	c.lock()
	defer c.unlock()
	for _, e := range c.replicasLocked(rel) {
		if e.state == stLoading || e.state == stResident && e.id == id {
			return true
		}
	}
	return false
}

// startBackgroundLocked creates a loading background entry for o, or
// says why not. It returns the regions to free after unlocking. Cache.mu
// must be held.
func (c *Cache) startBackgroundLocked(b triggers.Background, o *opened) (*entry, []gpu.Region, triggers.Outcome) {
	rel := b.Rel
	var regions []gpu.Region
	for _, e := range c.replicasLocked(rel) { // on any device
		switch {
		case e.state == stLoading || e.state == stResident && e.id == o.id:
			return nil, nil, triggers.Staged
		case e.state == stFailed && e.id == o.id:
			return nil, nil, triggers.NotStaged // a demand retries it and shows why
		}
	}
	for _, e := range c.replicasLocked(rel) {
		c.stats.invalidations.Add(1)
		regions = append(regions, c.dropLocked(e, "changed"))
	}
	switch {
	case c.closed:
		return nil, regions, triggers.NotStaged
	case b.Admit != nil && !b.Admit():
		return nil, regions, triggers.NotStaged
	case c.deferredLocked(rel):
		return nil, regions, triggers.Staged // being read: staged after its readers close
	case c.waiters.Len() > 0 || c.handedOff:
		return nil, regions, triggers.NoRoom // demand waiting for room comes first; no load during a hand-over
	}
	s, need, fds, victims, why := c.backgroundRoomLocked(o.id.size, b.MayEvict)
	if s == nil {
		return nil, regions, why
	}
	for _, v := range victims {
		s.lru.Remove(v.elem)
		v.elem = nil
		s.used -= v.reserved
		c.fdsUsed -= v.fds
	}
	s.used += need
	c.fdsUsed += fds
	regions = append(regions, c.detachVictimsLocked(victims)...)
	bg := b
	e := &entry{
		rel: rel, id: o.id, fid: o.fid, events: o.events, slot: s, gen: c.genLocked(rel, o.id),
		done: make(chan struct{}), state: stLoading, reserved: need, fds: fds,
		lastUse: b.LastUse, bg: &bg, ra: &loader.Background{},
	}
	e.ra.Ctx, e.ra.Cancel = context.WithCancel(c.ctx)
	e.ra.Low.Store(true)
	c.attachLocked(e)
	c.indexLocked(e)
	e.observeLocked(triggers.Started) // with the entry: an access racing with it finds it loading
	c.emitLocked(e.eventLocked(stLoading, b.Reason))
	return e, regions, 0
}

// backgroundRoomLocked picks the slot where a background load of size
// bytes evicts the fewest entries, and those entries (mayEvict allows
// each). nil: NotStaged when the file fits no slot, NoRoom when no slot
// has the room. Nothing is changed. Cache.mu must be held.
func (c *Cache) backgroundRoomLocked(size int64, mayEvict func(triggers.Victim) bool) (best *slot, need int64, fds int, victims []*entry, why triggers.Outcome) {
	why = triggers.NotStaged
	for _, s := range c.slots {
		n, f := s.need(size, int64(c.opts.ChunkSize)), s.dev.HeldDescriptors(size)
		if n > s.capacity || f > c.fdBudget {
			continue
		}
		why = triggers.NoRoom
		v, ok := c.backgroundVictimsLocked(s, n, f, mayEvict)
		if ok && (best == nil || len(v) < len(victims)) {
			best, need, fds, victims = s, n, f, v
		}
	}
	return best, need, fds, victims, why
}

// backgroundVictimsLocked walks s's LRU from the cold end and collects
// the entries mayEvict lets a background load take until need bytes and
// fds descriptors would be free; false when they are not enough. Nothing
// is changed. Cache.mu must be held.
func (c *Cache) backgroundVictimsLocked(s *slot, need int64, fds int, mayEvict func(triggers.Victim) bool) ([]*entry, bool) {
	room, fdRoom := s.capacity-s.used, c.fdBudget-c.fdsUsed
	var victims []*entry
	for el := s.lru.Back(); el != nil && (room < need || fdRoom < fds) && mayEvict != nil; el = el.Prev() {
		e := el.Value.(*entry)
		if mayEvict(triggers.Victim{Rel: e.rel, LastUse: e.lastUse, Leased: e.heldLocked()}) {
			victims = append(victims, e)
			room += e.reserved
			fdRoom += e.fds
		}
	}
	return victims, room >= need && fdRoom >= fds
}

// observeLocked tells e's trigger o, while e is a background load no
// demand promoted. Cache.mu must be held.
func (e *entry) observeLocked(o triggers.Outcome) {
	if e.bg != nil && e.bg.Observe != nil {
		e.bg.Observe(e.rel, o)
	}
}

// used records a demand use of rel's entry, if it has one, at tick at.
func (c *Cache) used(rel string, at uint64) {
	c.lock()
	for _, e := range c.replicasLocked(rel) {
		c.usedLocked(e, at)
	}
	c.unlock()
}

// usedLocked records a demand use of e at tick at. A background load
// joined by a demand is promoted: demand priority, never cancelled, its
// trigger told nothing more. Cache.mu must be held.
func (c *Cache) usedLocked(e *entry, at uint64) {
	e.lastUse = max(e.lastUse, at)
	if e.bg != nil {
		e.bg = nil
		e.ra.Low.Store(false)
	}
}

// leftLocked tells e's trigger that e, a background load never used,
// left the cache (wasted). Cache.mu must be held.
func (c *Cache) leftLocked(e *entry) { e.observeLocked(triggers.Left) }

// publishBackgroundLocked ends the load of e, a background load joined
// by nobody. Resident: its trigger hears Loaded. Otherwise the entry
// leaves quietly (a background failure is not shown as failed: the next
// demand tries again) and its trigger hears why (NoRoom, NotStaged), or
// Cancelled. It returns the region to free. Cache.mu must be held.
func (c *Cache) publishBackgroundLocked(e *entry, region gpu.Region, note string, err error) gpu.Region {
	// The trigger hears first, subscribers after: whoever waits for an
	// event finds the trigger told.
	cancelled := e.ra.Ctx.Err() != nil
	if err == nil && !e.detached && !cancelled {
		e.observeLocked(triggers.Loaded)
		c.residentLocked(e, region, note)
		return nil
	}
	switch {
	case cancelled:
		e.observeLocked(triggers.Cancelled)
	case errors.Is(err, gpu.ErrOutOfMemory):
		e.observeLocked(triggers.NoRoom)
	default:
		if err != nil {
			c.stats.loadErrors.Add(1)
		}
		e.observeLocked(triggers.NotStaged)
	}
	if c.attachedLocked(e) {
		reason := e.bg.Reason + " cancelled"
		if !cancelled {
			reason = fmt.Sprintf("%s failed: %v", e.bg.Reason, err)
		}
		c.dropLocked(e, reason) // loading: keeps its reservation, returned below
	}
	e.moveLocked(stAbsent)
	e.region = region
	return c.releaseLocked(e)
}
