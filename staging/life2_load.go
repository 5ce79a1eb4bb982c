package staging

// An entry's life, step 2: room is reserved on a slot (evicting unleased
// entries in LRU order), the region allocated, and the file read into it
// on the cuFile or the POSIX path by the slot's loader (staging/loader). The
// load checks at its end that the file did not change under it, then
// publishes (life3_publish.go).

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	"github.com/gdsfs/gdsfs/gpu"
	"github.com/gdsfs/gdsfs/staging/loader"
)

// startLocked creates a loading entry on want, or (nil) on the slot
// with the most room, evicting as needed, for the request in line as w
// (nil: not in line; admitLocked); at is the read-ahead clock's
// tick of the request (its last use). Where a replica of the file on
// another device can be copied device to device, the new entry is filled
// from it (e.src, pinned until the load ends). It returns the evicted
// regions for the caller to free after unlocking. Cache.mu must be held.
func (c *Cache) startLocked(rel string, o *opened, w *waiter, want *slot, at uint64, yield bool) (*entry, []gpu.Region, error) {
	id := o.id
	best := want
	if best == nil {
		room := int64(-1)
		for _, s := range c.slots {
			if eb, _ := s.evictableLocked(); s.capacity-s.used+eb > room {
				best, room = s, s.capacity-s.used+eb
			}
		}
	}
	need := best.need(id.size, int64(c.opts.ChunkSize))
	fds := best.dev.HeldDescriptors(id.size)
	if need > best.capacity {
		c.stats.tooLarge.Add(1)
		return nil, nil, errTooLarge(rel, need, best.capacity)
	}
	if fds > c.fdBudget {
		c.stats.tooLarge.Add(1)
		return nil, nil, errTooManyFDs(rel, fds, c.fdBudget)
	}
	regions, ok := c.admitLocked(w, best, need, fds)
	if !ok {
		return nil, regions, errNoSpace(rel, need)
	}
	c.stats.misses.Add(1)
	e := &entry{
		rel: rel, id: id, fid: o.fid, events: o.events, slot: best, gen: c.genLocked(rel, id),
		done: make(chan struct{}), state: stLoading, reserved: need, fds: fds, lastUse: at,
	}
	if yield {
		// Its tasks yield to demand loads, and a new reader through the
		// mount cancels it (readers.go).
		e.yielding, e.ra = true, &loader.Background{Gentle: true}
		e.ra.Ctx, e.ra.Cancel = context.WithCancel(c.ctx)
		e.ra.Low.Store(true)
	}
	if src := c.sourceLocked(rel, o, best); src != nil {
		e.src = src
		src.pins++
		c.usedLocked(src, at) // a demand depends on it: promoted if background
		if !yield {
			src.keepLocked() // nor cancelled for a reader
		}
	}
	c.attachLocked(e)
	c.indexLocked(e)
	c.emitLocked(e.eventLocked(stLoading, ""))
	return e, regions, nil
}

// load fills e from f (or from its source replica) and publishes the
// result.
func (c *Cache) load(e *entry, f *os.File) {
	defer c.wg.Done()
	defer f.Close()
	start := time.Now()
	path, note, region, err := c.loadInto(e, f)
	if err == nil {
		if now, _, ferr := fileIdentity(f); ferr != nil || now != e.id {
			err = fmt.Errorf("its attributes changed: %w", errFileChanged)
		}
	}
	if err == nil {
		err = region.Seal()
	}
	dur := time.Since(start)
	c.publish(e, region, path, note, err, dur)
}

// loadInto allocates e's region and fills it: device to device from e's
// source replica when it has one and that ends resident, otherwise from
// f, after waiting out the racy window where the file's filesystem raises
// no change events (racy.go).
func (c *Cache) loadInto(e *entry, f *os.File) (path, note string, region gpu.Region, err error) {
	if e.src != nil {
		if region, err = c.alloc(e); err != nil {
			c.unpin(e.src)
			return "", "", nil, err
		}
		var done bool
		if path, note, done, err = c.fillFromPeer(e, region); done {
			return path, note, region, err
		}
	}
	if err = c.waitRacy(e); err == nil && region == nil {
		region, err = c.alloc(e)
	}
	if err != nil {
		return "", note, region, err
	}
	p, n, err := c.fill(e, f, region)
	return p, loader.JoinNote(note, n), region, err
}

// alloc allocates e's region. When the device is out of memory (other
// processes use it too), it evicts unleased entries of e's slot one by one
// and tries again; a background load evicts nothing for it and fails.
func (c *Cache) alloc(e *entry) (gpu.Region, error) {
	for {
		r, err := e.slot.dev.Alloc(e.id.size)
		if err == nil || !errors.Is(err, gpu.ErrOutOfMemory) {
			return r, err
		}
		c.lock()
		if e.bg != nil {
			c.unlock()
			return nil, err
		}
		var victim *entry
		for el := e.slot.lru.Back(); el != nil && victim == nil; el = el.Prev() {
			if v := el.Value.(*entry); !v.heldLocked() {
				victim = v
			}
		}
		var vr gpu.Region
		if victim != nil {
			vr = c.dropLocked(victim, "evicted: the device is out of memory")
			c.stats.evictions.Add(1)
			victim.slot.evictions.Add(1)
		}
		c.unlockFree(vr)
		if victim == nil {
			return nil, err
		}
	}
}

// fill loads f into region by the path the options and the platform allow.
// It returns the path taken and, when that is not cuFile although cuFile
// exists, why.
func (c *Cache) fill(e *entry, f *os.File, region gpu.Region) (path, note string, err error) {
	return c.fillSpan(e, f, region, loader.Span{Off: 0, End: e.id.size})
}

// fillSpan is fill for the bytes of sp only (a share of a split ingest,
// peers.go): the slot's loader reads them, and the cuFile fallbacks it
// reports are counted.
func (c *Cache) fillSpan(e *entry, f *os.File, region gpu.Region, sp loader.Span) (path, note string, err error) {
	res, err := e.slot.loader.Load(loader.Request{
		Rel: e.rel, File: f, Size: e.id.size, Span: sp, Region: region, Background: e.ra,
		OpenDirect: func() (*os.File, error) { return c.openDirect(e) },
	})
	if res.CuFileFallback {
		c.stats.cufileFallbacks.Add(1)
	}
	if res.CuFileError != "" {
		c.stats.setCuFileError(res.CuFileError)
	}
	return res.Path, res.Note, err
}

// openDirect opens e's file again with O_DIRECT. Opened again by path, it
// must still be the inode e was opened as: otherwise the path names a new
// file now, and the load must start over (errFileChanged).
func (c *Cache) openDirect(e *entry) (*os.File, error) {
	if c.hooks.directOpen != nil {
		c.hooks.directOpen(e.rel)
	}
	df, st, err := c.openRegular(e.rel, syscall.O_DIRECT)
	if err != nil {
		return nil, err
	}
	if st.Dev != e.id.dev || st.Ino != e.id.ino {
		df.Close()
		return nil, fmt.Errorf("the path names another file than the one opened: %w", errFileChanged)
	}
	return df, nil
}
