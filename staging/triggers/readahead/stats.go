package readahead

import "sync/atomic"

// counters are cumulative, read without a lock.
type counters struct {
	issued, hits, wastedBytes, cancelled, declined atomic.Uint64
	replaySkipped, dropped                         atomic.Uint64
	replayPending                                  atomic.Int64
}

// Stats are the read-ahead counters, with their stats.json keys.
type Stats struct {
	// Issued: files the planner asked the cache to stage ahead.
	Issued uint64 `json:"readahead_issued"`
	// Hits: read-ahead files opened or leased while loading or resident,
	// before anything else used them.
	Hits uint64 `json:"readahead_hits"`
	// WastedBytes: sizes of read-ahead files evicted before anyone used
	// them, or cancelled while loading.
	WastedBytes uint64 `json:"readahead_wasted_bytes"`
	// Cancelled: requests that fell out of the window before they loaded.
	Cancelled uint64 `json:"readahead_cancelled"`
	// Declined: requests the cache did not load (already staged, no room,
	// not eligible).
	Declined uint64 `json:"readahead_declined"`
	// Dropped: accesses not seen by the detector because its queue was
	// full (the open path never waits for it).
	Dropped uint64 `json:"readahead_dropped"`
	// ReplayPending: trace entries not yet asked for.
	ReplayPending int64 `json:"replay_pending"`
	// ReplaySkipped: trace entries not staged because they are not
	// regular files of SOURCE now, or larger than readahead_bytes.
	ReplaySkipped uint64 `json:"replay_skipped"`
}

// Stats returns the counters.
func (r *ReadAhead) Stats() Stats {
	s := &r.stats
	return Stats{
		Issued: s.issued.Load(), Hits: s.hits.Load(), WastedBytes: s.wastedBytes.Load(),
		Cancelled: s.cancelled.Load(), Declined: s.declined.Load(), Dropped: s.dropped.Load(),
		ReplayPending: s.replayPending.Load(), ReplaySkipped: s.replaySkipped.Load(),
	}
}
