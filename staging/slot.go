package staging

import (
	"container/list"

	"github.com/gdsfs/gdsfs/gpu"
)

// slot is one device's share of the cache: its capacity, the bytes held
// and the LRU order of its evictable entries. All fields but dev and
// capacity are guarded by Cache.mu.
type slot struct {
	dev      gpu.Device
	capacity int64
	loader   *loader

	// INVARIANT: 0 <= used <= capacity.
	used int64      // bytes reserved by entries loading, resident or detached
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

// evictableLocked is how many bytes s could free by evicting unleased
// resident entries. Cache.mu must be held.
func (s *slot) evictableLocked() int64 {
	var n int64
	for el := s.lru.Front(); el != nil; el = el.Next() {
		if e := el.Value.(*entry); e.leases == 0 {
			n += e.reserved
		}
	}
	return n
}

// reserveLocked reserves need bytes, evicting unleased resident entries
// from the least recently used end. It returns the victims (already removed
// from the LRU; the caller detaches them from the map and frees their
// regions after unlocking) and false when even full eviction would not
// make room, in which case nothing was evicted. Cache.mu must be held.
func (s *slot) reserveLocked(need int64) ([]*entry, bool) {
	if s.capacity-s.used < need && s.capacity-s.used+s.evictableLocked() < need {
		return nil, false
	}
	var victims []*entry
	for el := s.lru.Back(); el != nil && s.capacity-s.used < need; {
		prev := el.Prev()
		if e := el.Value.(*entry); e.leases == 0 {
			s.lru.Remove(el)
			e.elem = nil
			victims = append(victims, e)
			s.used -= e.reserved
		}
		el = prev
	}
	s.used += need
	return victims, true
}
