package staging

// An entry's life, step 1: a request (an open through the mount, a
// prefetch, a lease) looks rel up. A resident entry whose file is
// unchanged is a hit; a loading one is joined; otherwise a new entry is
// started (life2_load.go).

import (
	"context"
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"syscall"
	"time"

	"github.com/gdsfs/gdsfs/gpu"
	"github.com/gdsfs/gdsfs/internal/access"
)

// Opened is the FUSE open trigger: with staging.prefetch=open it stages
// rel once its readers are done (readers.go), or at once without
// staging.defer_while_read; otherwise it only drops a stale entry. Either
// way the open feeds read-ahead (readahead.go). It never blocks.
func (c *Cache) Opened(rel string) { c.OpenedBy(rel, Reader{}) }

// OpenedBy is Opened with what the mount knows of the open (Reader):
// the staging after the last close also waits while the process that
// opened the file still maps it (staging/triggers.AfterRead).
func (c *Cache) OpenedBy(rel string, r Reader) {
	c.watch.drain()
	c.used(rel, c.ra.Opened(rel))
	switch {
	case c.opts.Prefetch == PrefetchOpen && c.opts.DeferWhileRead:
		c.openedDeferred(rel, r)
	case c.opts.Prefetch == PrefetchOpen:
		c.Prefetch(rel)
	default:
		c.lock()
		staged := len(c.entries[rel]) > 0
		c.unlock()
		if staged {
			c.checkIdentity(rel)
		}
	}
}

// Stage makes rel resident (loading it if needed) and returns its
// description. It waits for the load, bounded by ctx.
func (c *Cache) Stage(ctx context.Context, rel string) (Info, error) {
	return c.stage(ctx, rel, true)
}

// stage is Stage; wait says whether to wait for room (room.go).
// A staging is a use of the file, not an access read-ahead learns from.
func (c *Cache) stage(ctx context.Context, rel string, wait bool) (Info, error) {
	return c.stageOne(ctx, rel, nil, wait, c.ra.Tick())
}

// stageOne makes rel resident on on (nil: anywhere) and describes it.
func (c *Cache) stageOne(ctx context.Context, rel string, on *slot, wait bool, at uint64) (Info, error) {
	e, err := c.ensure(ctx, rel, place{slot: on, exact: on != nil}, wait, at)
	if err != nil {
		return Info{}, err
	}
	c.lock()
	info := e.infoLocked()
	r := c.unpinLocked(e)
	c.unlockFree(r)
	return info, nil
}

// Attr answers the user.gdsfs.state and user.gdsfs.path xattrs, after
// checking that the staged bytes still match the file. A file waiting in
// the prefetch queue, or that a replayed trace has yet to stage, is
// loading.
func (c *Cache) Attr(rel string) (state, path string) {
	c.watch.drain()
	c.checkIdentity(rel)
	c.lock()
	defer c.unlock()
	return c.attrLocked(rel)
}

// attrLocked is Attr without the checks. Cache.mu must be held.
func (c *Cache) attrLocked(rel string) (state, path string) {
	all := c.replicasLocked(rel)
	if len(all) == 0 {
		if c.queued[rel] > 0 || c.ra.Wanted(rel) {
			return StateLoading, "" // queued: it will load
		}
		return StateAbsent, ""
	}
	// Several replicas: loading while a prefetch of it waits or any
	// replica loads (warmup waits for them all), else resident if any is.
	e := all[0]
	for _, x := range all {
		if x.state == stLoading || x.state == stResident && e.state != stLoading {
			e = x
		}
	}
	info := e.infoLocked()
	if c.queuedOn[rel] > 0 && info.State != StateLoading {
		return StateLoading, info.LoadPath // replicas asked for are yet to load
	}
	return info.State, info.LoadPath
}

// Eligible checks that rel could be staged: a regular file under SOURCE
// that the options let through and that fits a device's capacity.
func (c *Cache) Eligible(rel string) error {
	o, err := c.openEligible(rel)
	if err != nil {
		return err
	}
	o.f.Close()
	var need int64
	for _, s := range c.slots {
		if need = s.need(o.id.size, int64(c.opts.ChunkSize)); need <= s.capacity {
			return nil
		}
	}
	return errTooLarge(rel, need, c.slots[0].capacity)
}

// place is where a request wants its file: slot (nil: anywhere); exact:
// there and nowhere else, whatever staging.placement says. With it go how
// the request waits: yield, and roomWait.
type place struct {
	slot     *slot
	exact    bool
	yield    bool          // a staging after a plain read: a new reader cancels it (readers.go)
	roomWait time.Duration // the longest wait for room (Request.RoomWait); 0: ctx bounds it
	// asked, when set, is the identity of the file as the asker opened it
	// (Request.File): a resident or loading replica of exactly that file
	// serves the request without opening rel again.
	asked *identity
	// resident: only a resident replica of asked serves the request;
	// none is loaded, copied or joined for it (Request.Resident).
	resident bool
}

// ensure returns rel's resident entry where p says (replicas.go), pinned
// (the caller unpins it or turns the pin into a lease), loading it if
// needed. Concurrent
// callers for one file share one load (single flight); each waits bounded
// by its own ctx, while the load itself belongs to the cache; at is the
// read-ahead clock's tick of the request (the entry's last use). Change
// events queued before the call are handled first, so a write that
// completed before it is never answered with the old bytes. A load that
// saw its file change is retried, maxAttempts in all, then EAGAIN. With
// wait, a request that finds no room waits for it (room.go).
func (c *Cache) ensure(ctx context.Context, rel string, p place, wait bool, at uint64) (*entry, error) {
	var w *waiter // in line for room
	defer func() {
		if w != nil {
			c.lock()
			c.leaveLocked(w)
			c.unlock()
		}
	}()
	for attempt := 1; ; {
		c.watch.drain()
		e := c.known(rel, p, w, at)
		if e == nil && p.resident {
			return nil, errNotResident(rel)
		}
		if e == nil {
			o, err := c.openEligible(rel)
			if err != nil {
				c.checkIdentity(rel) // a vanished or changed file loses its entry
				return nil, err
			}
			size := o.id.size
			e, err = c.lookupOrStart(rel, o, p, wait, &w, at)
			if errors.Is(err, errWaitRoom) {
				if err := c.awaitRoom(ctx, w, rel, size, p.roomWait); err != nil {
					return nil, err
				}
				continue
			}
			if err != nil {
				return nil, err
			}
		}
		select {
		case <-e.done:
		case <-ctx.Done():
			c.unpin(e)
			return nil, fmt.Errorf("stage %s: %w", rel, ctx.Err())
		}
		c.lock()
		state, lerr, detached, yielded := e.state, e.err, e.detached, e.yielded
		if state == stResident && !detached {
			c.unlock()
			return e, nil // pinned: the caller unpins or leases
		}
		r := c.unpinLocked(e)
		c.unlockFree(r)
		switch {
		case yielded && p.yield:
			return nil, errYielded(rel) // staged again after the new reader closes it
		case state == stFailed && !detached && !errors.Is(lerr, errFileChanged):
			return nil, lerr
		case attempt >= maxAttempts:
			return nil, errKeepsChanging(rel)
		}
		// Changed under the load, or evicted or invalidated between the
		// load's end and now: again.
		c.stats.loadRetries.Add(1)
		attempt++
	}
}

// openEligible opens rel and checks that it is a regular file that the
// options let through. The file's filesystem is watched from then on if
// it can be.
func (c *Cache) openEligible(rel string) (*opened, error) {
	if why := c.filter.why(rel); why != "" {
		return nil, errNotEligible(rel, why)
	}
	if c.hooks.eligible != nil {
		c.hooks.eligible(rel)
	}
	f, st, err := c.openRegular(rel, 0)
	if errors.Is(err, access.ErrNotRegular) {
		return nil, errNotEligible(rel, err.Error())
	}
	if err != nil {
		return nil, err
	}
	o := &opened{f: f}
	if st.Size < int64(c.opts.MinFileSize) {
		f.Close()
		return nil, errNotEligible(rel, fmt.Sprintf("smaller than staging.min_file_size (%s)", c.opts.MinFileSize))
	}
	// Watch first, then take the identity: a write that completes after
	// the identity was taken either changes it or raises an event.
	o.fid, o.events, o.why = c.watch.probe(f, st.Dev)
	if o.events {
		if err := unix.Fstat(int(f.Fd()), st); err != nil {
			f.Close()
			return nil, fmt.Errorf("%s: fstat: %w", rel, err)
		}
	}
	o.id = identityOf(st)
	return o, nil
}

// lookupOrStart returns the entry for o where p says: an existing
// resident or loading one, or a new one whose load it starts with o.f
// (copied from a replica on another device where one can be). It takes
// o.f: it is closed unless a load uses it. When there is no room it
// answers errWaitRoom with the request in line as *w (wait), or ENOSPC.
// The entry is used at tick at: a read-ahead load it joins is promoted.
func (c *Cache) lookupOrStart(rel string, o *opened, p place, wait bool, w **waiter, at uint64) (*entry, error) {
	c.lock()
	if c.closed {
		c.unlock()
		o.f.Close()
		return nil, fmt.Errorf("stage %s: cache closed", rel)
	}
	e, stale := c.existingLocked(rel, o.id, p, *w)
	if e != nil {
		joined := c.joinLocked(e, p, at)
		c.unlockFree(stale...)
		o.f.Close()
		if joined && c.hooks.joined != nil {
			c.hooks.joined(rel)
		}
		return e, nil
	}
	var victims []gpu.Region
	var err error
	switch {
	case p.yield && c.readingLocked(rel):
		// A reader opened the file again before this staging after a
		// read began: it yields at once (readers.go).
		c.stats.yielded.Add(1)
		err = errYielded(rel)
	case c.mayReserveLocked(*w):
		e, victims, err = c.startLocked(rel, o, *w, p.slot, at, p.yield)
	case c.handedOff && !wait:
		err = errHandingOver(rel)
	default:
		err = errNoSpace(rel, o.id.size) // others wait for room first
	}
	switch {
	case err == nil:
		e.pins++
		c.wg.Add(1)
		c.leaveLocked(*w)
	case wait && errors.Is(err, syscall.ENOSPC):
		c.queueLocked(w)
		err = errWaitRoom
	case errors.Is(err, syscall.ENOSPC):
		c.stats.noSpace.Add(1)
	}
	c.unlockFree(append(stale, victims...)...)
	if err != nil {
		o.f.Close()
		return nil, err
	}
	go c.load(e, o.f)
	return e, nil
}

// existingLocked returns the entry that serves a request for o's file
// where p says, pinned, when one is resident or loading (a hit, or a load
// to join; the request held as w leaves the line). Every replica of rel
// that is stale (another identity) or failed is dropped on the way; their
// regions are returned for the caller to free after unlocking. Cache.mu
// must be held.
func (c *Cache) existingLocked(rel string, id identity, p place, w *waiter) (*entry, []gpu.Region) {
	var live []*entry
	var free []gpu.Region
	for _, e := range c.replicasLocked(rel) {
		switch {
		case e.id != id:
			c.stats.invalidations.Add(1)
			free = append(free, c.dropLocked(e, "changed"))
		case e.state == stFailed: // try again
			free = append(free, c.dropLocked(e, "failed load dropped"))
		default:
			live = append(live, e)
		}
	}
	e := c.pickLocked(live, p.slot, p.exact)
	if e == nil {
		return nil, free
	}
	c.hitLocked(e, w)
	return e, free
}

// hitLocked pins e for a request that hit it (resident) or joined its
// load; the request held as w leaves the line. Cache.mu must be held.
func (c *Cache) hitLocked(e *entry, w *waiter) {
	if e.state == stResident {
		e.slot.lru.MoveToFront(e.elem)
		c.stats.hits.Add(1)
	} else {
		c.stats.sharedLoads.Add(1)
	}
	e.pins++
	c.leaveLocked(w)
}

// known is the hit of a request that names the file it opened
// (p.asked): rel's resident or loading replica of exactly that identity,
// where p says, pinned and joined as lookupOrStart joins it, without
// opening rel again. Replicas of another identity are left to the
// lookup that opens the file. nil: none (or no p.asked, or rel not
// eligible under the options). It takes Cache.mu itself.
func (c *Cache) known(rel string, p place, w *waiter, at uint64) *entry {
	if p.asked == nil || c.filter.why(rel) != "" {
		return nil
	}
	c.lock()
	if c.closed {
		c.unlock()
		return nil
	}
	var live []*entry
	for _, e := range c.replicasLocked(rel) {
		if e.id == *p.asked && e.state != stFailed && (e.state == stResident || !p.resident) {
			live = append(live, e)
		}
	}
	e := c.pickLocked(live, p.slot, p.exact)
	if e == nil {
		c.unlock()
		return nil
	}
	c.hitLocked(e, w)
	joined := c.joinLocked(e, p, at)
	c.unlock()
	if joined && c.hooks.joined != nil {
		c.hooks.joined(rel)
	}
	return e
}

// joinLocked records a request's use of e, which it joined or hit: the
// read-ahead clock's tick, and that a lease or prefetch wants it kept.
// It says whether e is still loading (a load joined). Cache.mu must be
// held.
func (c *Cache) joinLocked(e *entry, p place, at uint64) bool {
	c.usedLocked(e, at)
	if !p.yield {
		e.keepLocked() // a lease or prefetch joined it
	}
	return e.state == stLoading
}

// identityNow is the identity rel's file has now: a path-only (O_PATH)
// lookup beneath SOURCE and an fstat, no open for reading.
func (c *Cache) identityNow(rel string) (identity, error) {
	f, err := c.root.Open(rel, unix.O_PATH, 0, access.Beneath)
	if err != nil {
		return identity{}, err
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return identity{}, err
	}
	return identityOf(&st), nil
}

// checkIdentity drops the entry of rel if the file changed or vanished.
func (c *Cache) checkIdentity(rel string) {
	id, err := c.identityNow(rel)
	c.lock()
	var free []gpu.Region
	for _, e := range c.replicasLocked(rel) {
		if e.state != stLoading && (err != nil || e.id != id) {
			reason := "changed"
			if err != nil {
				reason = "gone"
			}
			free = append(free, c.dropLocked(e, reason))
			c.stats.invalidations.Add(1)
		}
	}
	c.unlockFree(free...)
}
