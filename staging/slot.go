package staging

import (
	"container/list"
	"sync/atomic"

	"github.com/gdsfs/gdsfs/gpu"
	"github.com/gdsfs/gdsfs/staging/loader"
)

// slot is one device's share of the cache: its capacity, the bytes held
// and the LRU order of its evictable entries. dev, index, capacity,
// loader and peer are fixed once New returns; the counters are atomic;
// the rest is guarded by Cache.mu.
type slot struct {
	dev      gpu.Device
	index    int // in Cache.slots (staging.gpus order)
	capacity int64
	loader   *loader.Loader
	// peer[j]: replicas are copied device to device between this slot
	// and slot j (the pair has peer access and staging.peer_copy allows).
	peer []bool

	// per-device counters for stats
	evictions   atomic.Uint64
	bytesRead   atomic.Uint64 // staged from SOURCE onto this device
	bytesCuFile atomic.Uint64 // of bytesRead, read by cuFile
	bytesPeer   atomic.Uint64 // copied onto it from another device

	// INVARIANT: 0 <= used <= capacity.
	used int64      // bytes reserved by entries loading, resident or detached, and private copies
	lru  *list.List // of *entry, resident and attached; front = most recent
}

// need is the device bytes a file of size bytes takes on s.
func (s *slot) need(size int64, chunkSize int64) int64 {
	var n int64
	for _, c := range gpu.SplitChunks(size, chunkSize, s.dev.Granularity()) {
		n += c
	}
	return n
}

// evictableLocked is how many bytes and descriptors s could free by
// evicting unleased resident entries. Cache.mu must be held.
func (s *slot) evictableLocked() (bytes int64, fds int) {
	for el := s.lru.Front(); el != nil; el = el.Next() {
		if e := el.Value.(*entry); !e.heldLocked() {
			bytes += e.reserved
			fds += e.fds
		}
	}
	return bytes, fds
}

// fitsLocked says whether need bytes and fds descriptors fit on s now.
// Cache.mu must be held.
func (c *Cache) fitsLocked(s *slot, need int64, fds int) bool {
	return s.capacity-s.used >= need && c.fdBudget-c.fdsUsed >= fds
}

// reserveLocked reserves need bytes on s and fds descriptors from the
// cache's budget, evicting unleased resident entries of s from the least
// recently used end. It returns the victims (already removed from the LRU,
// their reservations returned; the caller detaches them and frees their
// regions after unlocking) and false when even full eviction would not
// make room, in which case nothing was evicted. Cache.mu must be held.
func (c *Cache) reserveLocked(s *slot, need int64, fds int) ([]*entry, bool) {
	if !c.fitsLocked(s, need, fds) {
		eb, ef := s.evictableLocked()
		if s.capacity-s.used+eb < need || c.fdBudget-c.fdsUsed+ef < fds {
			return nil, false
		}
	}
	var victims []*entry
	for el := s.lru.Back(); el != nil && !c.fitsLocked(s, need, fds); {
		prev := el.Prev()
		if e := el.Value.(*entry); !e.heldLocked() {
			s.lru.Remove(el)
			e.elem = nil
			victims = append(victims, e)
			s.used -= e.reserved
			c.fdsUsed -= e.fds
		}
		el = prev
	}
	s.used += need
	c.fdsUsed += fds
	return victims, true
}
