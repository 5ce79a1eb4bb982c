package staging

// Read-ahead across files (staging/triggers/readahead decides; this file carries
// out its plans). Opens through the mount and leases feed the detector
// (Opened, Acquire); each Plan it returns asks for files to load ahead of
// the reader and for earlier requests to cancel. A read-ahead load:
//
//   - never blocks the open path: plans are carried out on the runner's
//     goroutine, each load on its own;
//   - never waits for room, and takes none while a demand waits for it;
//     it takes free room or the room of entries readahead.MayEvict allows
//     (never a leased or pinned entry, never one used since the access
//     that planned it, never one of the window);
//   - yields the loader's workers to demand loads (staging/loader), and runs
//     with a context of its own, cancelled when its file falls out of the
//     window before it loaded;
//   - is promoted by the first demand that meets it (an open, a lease, a
//     prefetch): demand priority, never cancelled from then on;
//   - is not held back by staging.defer_while_read: the files it asks for
//     are ahead of the reader, not being read (a file open through the
//     mount is left to its readers' last close).
//
// The runner is told of a read-ahead entry's changes (Started, Loaded,
// Declined, Evicted) under Cache.mu before subscribers get the event, so
// whoever waits for an event finds the runner already told.

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"go.uber.org/zap"

	"github.com/gdsfs/gdsfs/gpu"
	"github.com/gdsfs/gdsfs/internal/access"
	"github.com/gdsfs/gdsfs/staging/loader"
	"github.com/gdsfs/gdsfs/staging/triggers/readahead"
)

// newRunner makes the detector and its runner for cfg; directories are
// listed beneath root as the daemon.
func newRunner(cfg Config, root *access.Root, log *zap.Logger) *readahead.Runner {
	ra := readahead.New(readahead.Config{Options: cfg.Options.ReadAhead(), List: readahead.ListBeneath(root), Log: log})
	return readahead.NewRunner(ra, readahead.NewRecorder(cfg.Options.TraceEntries))
}

// readTrace reads staging.replay's trace (nil when none is set).
func readTrace(cfg Config) (*readahead.Trace, error) {
	if cfg.Options.Replay == "" {
		return nil, nil
	}
	t, err := readahead.ReadTraceFile(cfg.Options.Replay)
	if err != nil {
		return nil, fmt.Errorf("staging.replay: %w", err)
	}
	if t.Source != "" && cfg.Source != "" && t.Source != cfg.Source && cfg.Log != nil {
		cfg.Log.Warn("staging.replay: the trace was recorded over another SOURCE; its paths are taken relative to this one",
			zap.String("trace", cfg.Options.Replay), zap.String("trace_source", t.Source), zap.String("source", cfg.Source))
	}
	return t, nil
}

// startReadAhead starts the runner (unless a test drives it) and the
// replay of staging.replay's trace.
func (c *Cache) startReadAhead(cfg Config, replay *readahead.Trace) {
	if !cfg.manualReadAhead {
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			c.ra.Run(c.ctx, c.readAhead)
		}()
	}
	if replay != nil && len(replay.Paths) > 0 {
		c.log.Info("replaying a trace", zap.String("trace", cfg.Options.Replay), zap.Int("paths", len(replay.Paths)))
		c.ra.Replay(replay.Paths)
	}
}

// Replay stages rels in their order through the read-ahead window (a
// trace written to .gdsfs/replay, or staging.replay). It never blocks.
func (c *Cache) Replay(rels []string) { c.ra.Replay(rels) }

// Source is the directory files are staged from (SOURCE).
func (c *Cache) Source() string { return c.root.Path() }

// Trace is the access trace; nil when staging.trace_entries is 0.
func (c *Cache) Trace() *readahead.Recorder { return c.ra.Trace() }

// used records a demand use of rel's entry, if it has one, at tick at.
func (c *Cache) used(rel string, at uint64) {
	c.lock()
	for _, e := range c.replicasLocked(rel) {
		c.usedLocked(e, at)
	}
	c.unlock()
}

// usedLocked records a demand use of e at tick at. A read-ahead load
// joined by a demand is promoted: demand priority, never cancelled.
// Cache.mu must be held.
func (c *Cache) usedLocked(e *entry, at uint64) {
	e.lastUse = max(e.lastUse, at)
	if e.readahead {
		e.readahead = false
		e.ra.Low.Store(false)
	}
}

// leftLocked tells the runner that e, loaded ahead and never used, left
// the cache (wasted). Cache.mu must be held.
func (c *Cache) leftLocked(e *entry) {
	if e.readahead {
		c.ra.Evicted(e.rel)
	}
}

// readAhead carries out a Plan: the runner's goroutine calls it. It never
// blocks: each load runs on a goroutine of its own (the window bounds
// them). A cancelled load leaves the cache at once (its absent event says
// "read-ahead cancelled"); its region is freed when the load stops.
func (c *Cache) readAhead(p readahead.Plan) {
	var free []gpu.Region
	c.lock()
	for _, rel := range p.Cancel {
		for _, e := range c.replicasLocked(rel) {
			if e.readahead && e.state == stLoading {
				e.ra.Cancel()
				free = append(free, c.dropLocked(e, "read-ahead cancelled"))
			}
		}
	}
	closed := c.closed
	if !closed {
		c.wg.Add(len(p.Stage))
	}
	c.unlockFree(free...)
	for _, it := range p.Stage {
		if closed {
			c.declineReadAhead(it.Rel, readahead.NotStaged)
			continue
		}
		go c.readAheadLoad(it)
	}
}

// readAheadLoad opens it.Rel as the daemon and, if the cache takes it,
// loads it at read-ahead priority; otherwise it answers Declined. It ends
// the count readAhead added to c.wg.
func (c *Cache) readAheadLoad(it readahead.Item) {
	o, err := c.openEligible(it.Rel)
	if err != nil {
		c.wg.Done()
		c.declineReadAhead(it.Rel, readahead.NotStaged)
		return
	}
	c.lock()
	e, regions, why := c.startReadAheadLocked(it, o)
	c.unlockFree(regions...)
	if e == nil {
		o.f.Close()
		c.wg.Done()
		c.declineReadAhead(it.Rel, why)
		return
	}
	c.load(e, o.f) // its c.wg.Done ends readAhead's count
}

// startReadAheadLocked creates a loading read-ahead entry for o, or says
// why not. It returns the regions to free after unlocking. Cache.mu must
// be held.
func (c *Cache) startReadAheadLocked(it readahead.Item, o *opened) (*entry, []gpu.Region, readahead.Why) {
	rel := it.Rel
	var regions []gpu.Region
	for _, e := range c.replicasLocked(rel) { // on any device
		switch {
		case e.state == stLoading || e.state == stResident && e.id == o.id:
			return nil, nil, readahead.Staged
		case e.state == stFailed && e.id == o.id:
			return nil, nil, readahead.NotStaged // a demand retries it and shows why
		}
	}
	for _, e := range c.replicasLocked(rel) {
		c.stats.invalidations.Add(1)
		regions = append(regions, c.dropLocked(e, "changed"))
	}
	window := c.ra.Window()
	switch r := c.readers[rel]; {
	case c.closed:
		return nil, regions, readahead.NotStaged
	case !slices.ContainsFunc(window, func(w readahead.Item) bool { return w.Rel == rel }):
		return nil, regions, readahead.NotStaged // cancelled, or used, before its load began
	case r != nil && r.deferred:
		return nil, regions, readahead.Staged // being read: staged after its readers close
	case c.waiters.Len() > 0 || c.handedOff:
		return nil, regions, readahead.NoRoom // demand waiting for room comes first; no load during a hand-over
	}
	s, need, fds, victims, why := c.readAheadRoomLocked(o.id.size, window)
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
	e := &entry{
		rel: rel, id: o.id, fid: o.fid, events: o.events, slot: s, gen: c.genLocked(rel, o.id),
		done: make(chan struct{}), state: stLoading, reserved: need, fds: fds,
		lastUse: it.Heat, readahead: true, ra: &loader.Background{},
	}
	e.ra.Ctx, e.ra.Cancel = context.WithCancel(c.ctx)
	e.ra.Low.Store(true)
	c.attachLocked(e)
	c.indexLocked(e)
	c.ra.Started(rel) // with the entry: an access racing with it finds it loading, a hit
	c.emitLocked(e.eventLocked(stLoading, "read-ahead"))
	return e, regions, 0
}

// readAheadRoomLocked picks the slot where a read-ahead load of size bytes
// evicts the fewest entries, and those entries (MayEvict allows each).
// nil: NotStaged when the file fits no slot, NoRoom when no slot has the
// room. Nothing is changed. Cache.mu must be held.
func (c *Cache) readAheadRoomLocked(size int64, window []readahead.Item) (best *slot, need int64, fds int, victims []*entry, why readahead.Why) {
	why = readahead.NotStaged
	for _, s := range c.slots {
		n, f := s.need(size, int64(c.opts.ChunkSize)), s.dev.HeldDescriptors(size)
		if n > s.capacity || f > c.fdBudget {
			continue
		}
		why = readahead.NoRoom
		v, ok := c.readAheadVictimsLocked(s, n, f, window)
		if ok && (best == nil || len(v) < len(victims)) {
			best, need, fds, victims = s, n, f, v
		}
	}
	return best, need, fds, victims, why
}

// readAheadVictimsLocked walks s's LRU from the cold end and collects the
// entries MayEvict lets a read-ahead load take until need bytes and fds
// descriptors would be free; false when they are not enough. Nothing is
// changed. Cache.mu must be held.
func (c *Cache) readAheadVictimsLocked(s *slot, need int64, fds int, window []readahead.Item) ([]*entry, bool) {
	room, fdRoom := s.capacity-s.used, c.fdBudget-c.fdsUsed
	var victims []*entry
	for el := s.lru.Back(); el != nil && (room < need || fdRoom < fds); el = el.Prev() {
		e := el.Value.(*entry)
		use := readahead.Use{Rel: e.rel, LastUse: e.lastUse, Leased: e.heldLocked()}
		if readahead.MayEvict(use, window) {
			victims = append(victims, e)
			room += e.reserved
			fdRoom += e.fds
		}
	}
	return victims, room >= need && fdRoom >= fds
}

// publishReadAheadLocked ends the load of e, started by read-ahead and
// joined by nobody. Resident: the runner hears Loaded. Otherwise the
// entry leaves quietly (a read-ahead failure is not shown as failed: the
// next demand tries again) and the runner hears Declined, unless the load
// was cancelled. It returns the region to free. Cache.mu must be held.
func (c *Cache) publishReadAheadLocked(e *entry, region gpu.Region, note string, err error) gpu.Region {
	// The runner hears first, subscribers after: whoever waits for an
	// event finds the runner told.
	cancelled := e.ra.Ctx.Err() != nil
	if err == nil && !e.detached && !cancelled {
		c.ra.Loaded(e.rel)
		c.residentLocked(e, region, note)
		return nil
	}
	switch {
	case cancelled:
	case errors.Is(err, gpu.ErrOutOfMemory):
		c.declineReadAhead(e.rel, readahead.NoRoom)
	default:
		if err != nil {
			c.stats.loadErrors.Add(1)
		}
		c.declineReadAhead(e.rel, readahead.NotStaged)
	}
	if c.attachedLocked(e) {
		reason := "read-ahead cancelled"
		if !cancelled {
			reason = fmt.Sprintf("read-ahead failed: %v", err)
		}
		c.dropLocked(e, reason) // loading: keeps its reservation, returned below
	}
	e.moveLocked(stAbsent)
	e.region = region
	return c.releaseLocked(e)
}

// declineReadAhead answers a read-ahead request the cache did not take.
func (c *Cache) declineReadAhead(rel string, why readahead.Why) {
	c.ra.Declined(rel, why)
	if c.hooks.declined != nil {
		c.hooks.declined(rel, why)
	}
}
