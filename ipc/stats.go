package ipc

import (
	"maps"
	"sync"
	"sync/atomic"
	"time"
)

// Stats are the server's counters and gauges, with the keys of stats.json.
// LeasesActive counts lease ids granted and not released: a file a client
// keeps mapped after releasing it (the fast path) is held, not active.
type Stats struct {
	Connections     uint64 `json:"ipc_connections"`
	OpenConnections int    `json:"ipc_open_connections"`
	Requests        uint64 `json:"ipc_requests"`
	BadRequests     uint64 `json:"ipc_bad_requests"`
	AcceptErrors    uint64 `json:"ipc_accept_errors"`
	Timeouts        uint64 `json:"ipc_timeouts"`
	Refused         uint64 `json:"ipc_refused"`
	LeaseDenied     uint64 `json:"lease_denied"`
	LeasesActive    int    `json:"leases_active"`
	// Bytes and files handed out over connections still open: they count
	// against the capacity until those connections close.
	HeldBytes          int64 `json:"lease_held_bytes"`
	HeldFiles          int   `json:"lease_held_files"`
	HoldingConnections int   `json:"lease_holding_connections"`
	// Loads a client served some other way (the autoloader's fallbacks),
	// in total and per reason.
	AutoloadFallbacks       uint64            `json:"autoload_fallbacks"`
	AutoloadFallbackReasons map[string]uint64 `json:"autoload_fallback_reasons"`
}

// Stats returns the counters.
func (s *Server) Stats() Stats {
	st := Stats{
		Connections: s.conns.Load(), Requests: s.requests.Load(), BadRequests: s.bad.Load(),
		AcceptErrors: s.acceptErrs.Load(), Timeouts: s.timeouts.Load(), Refused: s.refused.Load(),
		LeaseDenied: s.denied.Load(),
	}
	st.AutoloadFallbacks, st.AutoloadFallbackReasons = s.reports.snapshot()
	s.mu.Lock()
	st.OpenConnections = s.total.conns
	st.LeasesActive = s.total.leases
	st.HeldBytes = s.total.bytes
	st.HeldFiles = s.total.files
	st.HoldingConnections = s.total.hold
	s.mu.Unlock()
	return st
}

// roomCache remembers how much of the capacity is free, read from the
// cache's stats at most every 50ms (they cost a walk of the entries).
type roomCache struct {
	mu   sync.Mutex
	at   time.Time
	free int64
}

// cacheable says whether an acquire answer may let the client keep the
// file mapped after release: shared mode, and at least ipc.cache_headroom
// of the capacity free.
func (s *Server) cacheable() bool {
	if s.cfg.Options.Sharing != SharingShared {
		return false
	}
	s.room.mu.Lock()
	defer s.room.mu.Unlock()
	if now := time.Now(); now.Sub(s.room.at) > 50*time.Millisecond {
		st := s.cfg.Cache.Stats()
		s.room.free, s.room.at = st.CapacityBytes-st.UsedBytes, now
	}
	return s.room.free >= s.headroom
}

// Bounds on the fallback reasons counted per reason. Any local user may
// report, so the reasons are bounded in all and per uid: a uid may name at
// most maxReasonsPerUID reasons first (others' reasons it may count
// freely; proto checks each reason's form). Reports past a bound still
// count in the total, and under otherReason.
const (
	maxReasons       = 64
	maxReasonsPerUID = 8
	otherReason      = "other"
)

// reports counts report requests.
type reports struct {
	total    atomic.Uint64
	mu       sync.Mutex
	byReason map[string]uint64 // guarded by mu; INVARIANT: len <= maxReasons
	namedBy  map[uint32]int    // guarded by mu: reasons each uid named first
}

// add counts one fallback reported by uid.
func (r *reports) add(uid uint32, reason string) {
	r.total.Add(1)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.byReason == nil {
		r.byReason, r.namedBy = map[string]uint64{}, map[uint32]int{}
	}
	if _, ok := r.byReason[reason]; !ok {
		named := len(r.byReason)
		if _, ok := r.byReason[otherReason]; ok {
			named--
		}
		switch {
		case reason == otherReason:
		case named >= maxReasons-1 || r.namedBy[uid] >= maxReasonsPerUID:
			reason = otherReason // one slot stays for it
		default:
			r.namedBy[uid]++
		}
	}
	r.byReason[reason]++
}

func (r *reports) snapshot() (uint64, map[string]uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]uint64, len(r.byReason))
	for k, v := range r.byReason {
		out[k] = v
	}
	return r.total.Load(), out
}

// state is what a successor needs to go on counting (Handoff).
func (r *reports) state() (total uint64, byReason map[string]uint64, namedBy map[uint32]int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.total.Load(), maps.Clone(r.byReason), maps.Clone(r.namedBy)
}

// restore goes on counting from a predecessor's state (Adopt); reasons
// past the bounds of this version are counted under otherReason.
func (r *reports) restore(total uint64, byReason map[string]uint64, namedBy map[uint32]int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.total.Store(total)
	r.byReason, r.namedBy = map[string]uint64{}, map[uint32]int{}
	for uid, n := range namedBy {
		r.namedBy[uid] = n
	}
	for reason, n := range byReason {
		if len(r.byReason) >= maxReasons-1 && reason != otherReason {
			reason = otherReason
		}
		r.byReason[reason] += n
	}
}
