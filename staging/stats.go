package staging

import (
	"sync"
	"sync/atomic"

	"github.com/gdsfs/gdsfs/staging/triggers/readahead"
)

// counters are the cache's cumulative counts.
type counters struct {
	prefetches, prefetchDropped          atomic.Uint64
	hits, misses, sharedLoads            atomic.Uint64
	evictions, invalidations, loadErrors atomic.Uint64
	tooLarge, noSpace, cufileFallbacks   atomic.Uint64
	bytesCuFile, bytesPOSIX, bytesHost   atomic.Uint64
	leasesTotal                          atomic.Uint64
	changeEvents, racyWaits, loadRetries atomic.Uint64
	freeErrors, roomWaits, yielded       atomic.Uint64
	bytesPeer, splitLoads                atomic.Uint64
	leasesActive                         atomic.Int64

	errMu         sync.Mutex
	lastCuFileErr string // guarded by errMu
}

func (s *counters) addBytes(path string, n int64) {
	switch path {
	case PathCuFile:
		s.bytesCuFile.Add(uint64(n))
	case PathPOSIX:
		s.bytesPOSIX.Add(uint64(n))
	case PathHost:
		s.bytesHost.Add(uint64(n))
	}
}

func (s *counters) setCuFileError(msg string) {
	s.errMu.Lock()
	s.lastCuFileErr = msg
	s.errMu.Unlock()
}

// Stats is a snapshot of the cache's counters and occupancy, with the keys
// of stats.json.
type Stats struct {
	Prefetches      uint64 `json:"prefetches"`
	PrefetchQueued  int    `json:"prefetch_queued"` // waiting in the queue or being staged now
	PrefetchDropped uint64 `json:"prefetch_dropped"`
	StagedFiles     int    `json:"staged_files"`
	LoadingFiles    int    `json:"loading_files"`
	FailedFiles     int    `json:"failed_files"`
	BytesCuFile     uint64 `json:"bytes_cufile"`
	BytesPOSIX      uint64 `json:"bytes_posix"`
	BytesHost       uint64 `json:"bytes_host"`
	BytesPeer       uint64 `json:"bytes_peer"`  // copied device to device into replicas
	SplitLoads      uint64 `json:"split_loads"` // files read once from SOURCE for several devices (split ingest)
	Hits            uint64 `json:"hits"`
	Misses          uint64 `json:"misses"`
	SharedLoads     uint64 `json:"shared_loads"`
	Evictions       uint64 `json:"evictions"`
	Invalidations   uint64 `json:"invalidations"`
	LoadErrors      uint64 `json:"load_errors"`
	TooLarge        uint64 `json:"too_large"`
	NoSpace         uint64 `json:"no_space"`
	CuFileFallbacks uint64 `json:"cufile_fallbacks"`
	CuFileLastError string `json:"cufile_last_error"`
	ResidentBytes   int64  `json:"resident_bytes"`
	UsedBytes       int64  `json:"used_bytes"`
	CapacityBytes   int64  `json:"capacity_bytes"`
	LeasesActive    int64  `json:"leases_pinned"` // staging leases: files pinned by open connections
	LeasesTotal     uint64 `json:"leases_total"`
	// ChangeDetection is how changes to SOURCE's own filesystem are seen:
	// "fanotify" or "timestamps: WHY".
	ChangeDetection string `json:"change_detection"`
	ChangeEvents    uint64 `json:"change_events"`  // events that concerned a staged file
	RacyWaits       uint64 `json:"racy_waits"`     // loads that waited out staging.racy_window
	LoadRetries     uint64 `json:"load_retries"`   // loads started again: the file changed under one
	FreeErrors      uint64 `json:"free_errors"`    // regions the device failed to free
	RoomWaits       uint64 `json:"room_waits"`     // requests that waited for room
	RoomWaiting     int    `json:"room_waiting"`   // requests waiting for room now
	DeferredOpens   uint64 `json:"deferred_opens"` // opens whose staging waited for the readers
	// YieldedToReaders counts stagings after a plain read cancelled
	// because a reader opened the file through the mount again.
	YieldedToReaders uint64 `json:"yielded_to_readers"`
	// MappedReadWaits counts stagings after a plain read that waited for
	// the file's page cache to stop growing (read through a mapping
	// after its last close).
	MappedReadWaits uint64 `json:"mapped_read_waits"`
	ReadersOpen     int    `json:"readers_open"`    // files open for reading through the mount now
	IOThreads       int    `json:"io_threads"`      // io.num_threads in force (auto resolved)
	IOBounceBytes   int64  `json:"io_bounce_bytes"` // io.bounce_size in force
	// Descriptors held by staged regions, and the budget they may use
	// (RLIMIT_NOFILE less the reserve kept for the FUSE server and leases).
	DescriptorsUsed   int `json:"descriptors_used"`
	DescriptorBudget  int `json:"descriptor_budget"`
	DescriptorReserve int `json:"descriptor_reserve"`
	// Devices is each device's share, in staging.gpus order.
	Devices []DeviceStats `json:"devices"`
	// The read-ahead counters (readahead_*, replay_*), at the top level of
	// stats.json.
	readahead.Stats
}

// DeviceStats is one device's share of the cache.
type DeviceStats struct {
	Name          string `json:"name"`    // "GPU-<uuid>", "host", "hostN"
	Ordinal       int    `json:"ordinal"` // as gpus= lists name it
	CapacityBytes int64  `json:"capacity_bytes"`
	UsedBytes     int64  `json:"used_bytes"`
	ResidentBytes int64  `json:"resident_bytes"`
	StagedFiles   int    `json:"staged_files"`
	LoadingFiles  int    `json:"loading_files"`
	LeasesPinned  int    `json:"leases_pinned"`
	Evictions     uint64 `json:"evictions"`
	BytesRead     uint64 `json:"bytes_read"`   // staged from SOURCE onto it
	BytesCuFile   uint64 `json:"bytes_cufile"` // of bytes_read, read by cuFile
	BytesPeer     uint64 `json:"bytes_peer"`   // copied onto it from other devices
	// Peers are the devices replicas are copied from and to device to
	// device.
	Peers []string `json:"peers"`
}

// Stats returns the current counters.
func (c *Cache) Stats() Stats {
	s := &c.stats
	out := Stats{
		Prefetches: s.prefetches.Load(), PrefetchDropped: s.prefetchDropped.Load(),
		BytesCuFile: s.bytesCuFile.Load(), BytesPOSIX: s.bytesPOSIX.Load(), BytesHost: s.bytesHost.Load(),
		BytesPeer: s.bytesPeer.Load(), SplitLoads: s.splitLoads.Load(),
		Hits: s.hits.Load(), Misses: s.misses.Load(), SharedLoads: s.sharedLoads.Load(),
		Evictions: s.evictions.Load(), Invalidations: s.invalidations.Load(), LoadErrors: s.loadErrors.Load(),
		TooLarge: s.tooLarge.Load(), NoSpace: s.noSpace.Load(), CuFileFallbacks: s.cufileFallbacks.Load(),
		LeasesActive: s.leasesActive.Load(), LeasesTotal: s.leasesTotal.Load(),
		ChangeDetection: c.watch.mode(c.sourceDev), ChangeEvents: s.changeEvents.Load(),
		RacyWaits: s.racyWaits.Load(), LoadRetries: s.loadRetries.Load(), FreeErrors: s.freeErrors.Load(),
		RoomWaits: s.roomWaits.Load(), YieldedToReaders: s.yielded.Load(), IOThreads: int(c.io.NumThreads), IOBounceBytes: int64(c.io.BounceSize),
		DescriptorBudget: c.fdBudget, DescriptorReserve: c.fdReserve,
	}
	out.Stats = c.ra.Stats()
	s.errMu.Lock()
	out.CuFileLastError = s.lastCuFileErr
	s.errMu.Unlock()
	c.lock()
	defer c.unlock()
	out.Devices = make([]DeviceStats, len(c.slots))
	for i, sl := range c.slots {
		out.Devices[i] = c.slotStatsLocked(sl)
		out.UsedBytes += sl.used
		out.CapacityBytes += sl.capacity
	}
	for _, cs := range c.entries {
		for _, e := range cs {
			if e == nil {
				continue
			}
			d := &out.Devices[e.slot.index]
			d.LeasesPinned += e.leases
			switch e.state {
			case stResident:
				out.StagedFiles++
				out.ResidentBytes += e.id.size
				d.StagedFiles++
				d.ResidentBytes += e.id.size
			case stLoading:
				out.LoadingFiles++
				d.LoadingFiles++
			case stFailed:
				out.FailedFiles++
			}
		}
	}
	out.DescriptorsUsed = c.fdsUsed
	if c.queue != nil {
		out.PrefetchQueued = c.queue.Len()
	}
	out.RoomWaiting = c.waiters.Len()
	if c.afterRead != nil {
		out.ReadersOpen = c.afterRead.Open()
	}
	n := c.afterReadCounters
	out.DeferredOpens, out.MappedReadWaits = n["deferred_opens"].Load(), n["mapped_read_waits"].Load()
	return out
}

// slotStatsLocked is s's DeviceStats without the entry counts. Cache.mu
// must be held.
func (c *Cache) slotStatsLocked(s *slot) DeviceStats {
	d := DeviceStats{
		Name: s.dev.Name(), Ordinal: slotOrdinal(s), CapacityBytes: s.capacity, UsedBytes: s.used,
		Evictions: s.evictions.Load(), BytesRead: s.bytesRead.Load(), BytesCuFile: s.bytesCuFile.Load(), BytesPeer: s.bytesPeer.Load(), Peers: []string{},
	}
	for j, ok := range s.peer {
		if ok {
			d.Peers = append(d.Peers, c.slots[j].dev.Name())
		}
	}
	return d
}

// checkInvariantsLocked panics if the cache's books are off (the
// INVARIANT lines on Cache, slot and entry). Cache.mu must be held. In
// tests every c.unlock runs it.
func (c *Cache) checkInvariantsLocked() {
	held := map[*slot]int64{}
	inLRU := map[*slot]int{}
	fds := 0
	for rel, cs := range c.entries {
		if len(cs) != len(c.slots) {
			panic("staging: a file's replicas are not one per slot")
		}
		for i, e := range cs {
			if e == nil {
				continue
			}
			if e.rel != rel || e.slot.index != i || e.detached {
				panic("staging: an entry is attached under another path or slot, or detached")
			}
			if e.elem != nil {
				if e.state != stResident {
					panic("staging: an entry that is not resident has an LRU element")
				}
				inLRU[e.slot]++
			}
			held[e.slot] += e.reserved
			fds += e.fds
		}
	}
	if c.fdsUsed < 0 || c.fdsUsed > c.fdBudget || fds > c.fdsUsed {
		panic("staging: descriptors used outside 0..budget, or entries hold more than counted")
	}
	for _, s := range c.slots {
		if s.used < 0 || s.used > s.capacity {
			panic("staging: slot used outside 0..capacity")
		}
		if held[s] > s.used {
			panic("staging: entries hold more than their slot counts")
		}
		n := 0
		for el := s.lru.Front(); el != nil; el = el.Next() {
			e := el.Value.(*entry)
			if e.state != stResident || e.detached || e.slot != s || e.elem != el {
				panic("staging: LRU holds an entry that is not resident and attached on its slot")
			}
			n++
		}
		if n != inLRU[s] {
			panic("staging: LRU and the attached entries disagree")
		}
	}
}
