package staging

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/gpu"
)

// Lease pins a resident file: its entry is not evicted or freed until
// Release. A private lease holds its own device copy.
type Lease struct {
	c      *Cache
	e      *entry
	region gpu.Region // what the lease shows: the entry's, or own
	once   sync.Once

	// guarded by Cache.mu
	own        gpu.Region // the private copy; nil if shared (or not made)
	private    int64      // bytes reserved for the private copy
	privateFDs int        // descriptors reserved for it
}

// Request is one acquire.
type Request struct {
	// Rel is the path relative to SOURCE.
	Rel string
	// File, when set, is the file as the asker opened it (as the asker,
	// so the kernel checked its right to read it). The lease is of exactly
	// that file (same device and inode) or the acquire fails with EAGAIN.
	File *os.File
	// Private gives the lease its own device copy.
	Private bool
	// Device is where the asker runs: "GPU-<uuid>", "host", "hostN" or
	// an ordinal of staging.gpus. Under staging.placement replica the
	// lease is of the replica there (made if needed: copied device to
	// device from another replica, or staged); under node, of the copy
	// wherever it is (staged there if it is nowhere yet). A device this
	// cache does not stage onto is not an error: the lease is served as
	// if none was named, and Lease.Device says where it is. "": none.
	Device string
	// RoomWait bounds the waits for room (capacity or descriptors held by
	// leases and loads; room.go), counted from when the request got in
	// line: past it the acquire fails with ENOSPC wrapping ErrRoomWait.
	// Staging itself is bounded by the context only. 0: the context
	// bounds the wait too.
	RoomWait time.Duration
	// Resident: lease only a replica of File resident now (where Device
	// and the placement say): one that is not fails with ENODATA and
	// nothing is loaded, copied or waited for, and read-ahead learns of
	// the access only once it is granted. Needs File; not with Private
	// (the lease's own copy is a copy: ENODATA).
	Resident bool
}

// Acquire stages req.Rel if needed (waiting, bounded by ctx) and leases it.
// Every acquire (a repeat lease on a cached connection too) is an access
// read-ahead learns from, told before waiting: the next files start
// loading while the asker waits for this one.
func (c *Cache) Acquire(ctx context.Context, req Request) (*Lease, error) {
	if req.Resident && req.Private {
		return nil, errResidentPrivate(req.Rel)
	}
	if req.Resident {
		// Asked of a file that may not be resident: an access read-ahead
		// learns from only once granted.
		l, err := c.acquire(ctx, req, c.ra.Tick())
		if err == nil {
			c.ra.Leased(req.Rel)
		}
		return l, err
	}
	return c.acquire(ctx, req, c.ra.Leased(req.Rel))
}

// acquire is Acquire, its access stamped at (the read-ahead clock's tick).
func (c *Cache) acquire(ctx context.Context, req Request, at uint64) (*Lease, error) {
	var want *unix.Stat_t
	if req.File != nil {
		want = new(unix.Stat_t)
		if err := unix.Fstat(int(req.File.Fd()), want); err != nil {
			return nil, fmt.Errorf("acquire %s: fstat: %w", req.Rel, err)
		}
	}
	p := place{roomWait: req.RoomWait, resident: req.Resident}
	if want != nil {
		id := identityOf(want)
		p.asked = &id
	}
	if req.Device != "" {
		p.slot, _ = c.slotFor(req.Device)
	}
	for {
		e, err := c.ensure(ctx, req.Rel, p, true, at)
		if err != nil {
			return nil, err
		}
		c.lock()
		if e.detached || e.state != stResident {
			r := c.unpinLocked(e)
			c.unlockFree(r)
			continue // invalidated since: stage again
		}
		if want != nil && (e.id.dev != want.Dev || e.id.ino != want.Ino) {
			c.unpinLocked(e) // attached: nothing to free
			c.unlock()
			// Renamed or replaced between the asker's open and the load:
			// what was staged is not what the asker may read.
			return nil, fmt.Errorf("%s changed while it was being leased; try again: %w", req.Rel, unix.EAGAIN)
		}
		e.leases++
		e.pins-- // the request's hold becomes the lease
		l := &Lease{c: c, e: e, region: e.region}
		c.stats.leasesActive.Add(1)
		c.stats.leasesTotal.Add(1)
		c.unlock()
		if req.Private {
			if err := l.copyPrivate(ctx, req.RoomWait); err != nil {
				l.Release()
				return nil, err
			}
		}
		return l, nil
	}
}

// copyPrivate gives l its own copy of the entry's region, counted
// against the capacity and the descriptor budget until Release. It waits
// for room as a load does (room.go), at most roomWait (0: bounded by ctx
// only).
func (l *Lease) copyPrivate(ctx context.Context, roomWait time.Duration) error {
	c, e := l.c, l.e
	need := e.slot.need(e.id.size, int64(c.opts.ChunkSize))
	fds := e.slot.dev.HeldDescriptors(e.id.size)
	if need > e.slot.capacity-e.reserved || fds > c.fdBudget-e.fds {
		return errTooLarge(e.rel+" (a private copy beside the staged one)", need, e.slot.capacity-e.reserved)
	}
	var w *waiter
	for {
		c.lock()
		regions, ok := c.admitLocked(w, e.slot, need, fds)
		if ok {
			l.private, l.privateFDs = need, fds
			c.leaveLocked(w)
		} else {
			c.queueLocked(&w)
		}
		c.unlockFree(regions...)
		if ok {
			break
		}
		if err := c.awaitRoom(ctx, w, e.rel+" (private copy)", need, roomWait); err != nil {
			return err
		}
	}
	r, err := e.slot.dev.Alloc(e.id.size)
	if err == nil {
		if err = e.slot.dev.Copy(r, l.region); err == nil {
			err = r.Seal()
		}
		if err != nil {
			c.freeRegion(r)
		}
	}
	if err != nil {
		return fmt.Errorf("private copy of %s: %w", e.rel, err)
	}
	l.own, l.region = r, r
	return nil
}

// Release ends the lease; calling it again does nothing. It frees the
// lease's private copy, if it made one, and never the entry's region
// unless this was the last lease of a detached entry.
func (l *Lease) Release() {
	l.once.Do(func() {
		c, e := l.c, l.e
		var free []gpu.Region
		c.lock()
		e.leases--
		c.stats.leasesActive.Add(-1)
		e.slot.used -= l.private
		c.fdsUsed -= l.privateFDs
		l.private, l.privateFDs = 0, 0
		if l.own != nil {
			free = append(free, l.own)
			l.own = nil
		}
		if e.detached && !e.heldLocked() {
			free = append(free, c.releaseLocked(e))
		}
		c.wakeLocked() // unleased: evictable; a private copy's room back
		c.unlockFree(free...)
	})
}

// Path is the SOURCE-relative path leased.
func (l *Lease) Path() string { return l.e.rel }

// Inode is the device and inode number of the file staged.
func (l *Lease) Inode() (dev, ino uint64) { return l.e.id.dev, l.e.id.ino }

// Size is the file size.
func (l *Lease) Size() int64 { return l.e.id.size }

// Times are the modification and change times (nanoseconds) of the
// version of the file staged.
func (l *Lease) Times() (mtime, ctime int64) { return l.e.id.mtime, l.e.id.ctime }

// Generation identifies this staging of the file: a re-staged file gets a
// new one.
func (l *Lease) Generation() uint64 { return l.e.gen }

// Device names the device holding the bytes ("GPU-<uuid>", "host" or
// "hostN").
func (l *Lease) Device() string { return l.e.slot.dev.Name() }

// Chunks returns the chunk lengths of the leased region.
func (l *Lease) Chunks() []int64 { return l.region.Chunks() }

// Export returns one descriptor per chunk; the caller closes them.
func (l *Lease) Export() ([]*os.File, error) { return l.region.Export() }

// Region is the leased region (for in-process consumers and tests).
func (l *Lease) Region() gpu.Region { return l.region }
