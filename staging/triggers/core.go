package triggers

// What a trigger and the cache say to each other. The cache
// (*staging.Cache) implements Core; a trigger gets it from the daemon's
// wiring (staging.Config) and never imports staging. The calls marked
// "under Cache.mu" are made with the cache's lock held: they must not call
// the cache, and a lock they take must be a leaf (taken after Cache.mu or
// alone, nothing taken with it held).

// Core is the cache's API for triggers that load files nobody asked for.
type Core interface {
	// StartBackground opens b.Rel and, if the cache takes it, starts its
	// load at background priority (below every demand, yielding the
	// loader's workers to demand loads) and answers Started (b.Observe
	// heard Started already, under Cache.mu). Otherwise it answers why
	// not: Staged, NoRoom or NotStaged (b.Observe hears nothing of it).
	// It opens the file (I/O) and never waits for room or for the load.
	StartBackground(b Background) Outcome
	// CancelBackground cancels the background loads of rel still loading
	// and not promoted: each leaves the cache at once (its absent event
	// gives reason) and its Observe hears Left, then Cancelled when the
	// load stops.
	CancelBackground(rel, reason string)
	// Go runs f on a goroutine the cache waits for when it closes; false
	// (f not run): the cache is closed.
	Go(f func()) bool
}

// Background is a request for a load at background priority. The first
// demand that meets its entry (an open, a lease, a prefetch, a replica
// copied from it) promotes it: demand priority, never cancelled, and
// its trigger hears nothing more of it.
type Background struct {
	Rel string
	// LastUse stands for the entry's last use until a demand uses it
	// (what Victim.LastUse says of it).
	LastUse uint64
	// Reason is the loading event's Reason ("read-ahead").
	Reason string
	// Admit, under Cache.mu before room is looked for, says whether the
	// load is still wanted; false: NotStaged. Nil: always.
	Admit func() bool
	// MayEvict, under Cache.mu, is the victim-choice hook: whether the
	// load may take the room of the resident entry v (the cache offers
	// them from the cold end of a device's LRU, never a loading one).
	// Nil: free room only. Where the room it allows is not enough the
	// load is not started (NoRoom) and nothing is evicted.
	MayEvict func(v Victim) bool
	// Observe hears what becomes of the load (Started, Loaded, NoRoom,
	// NotStaged, Cancelled, Left), under Cache.mu, in the order of the
	// entry's events and before subscribers get the event it goes with,
	// until a demand promotes the entry. Nil: nothing is told.
	Observe func(rel string, o Outcome)
}

// Victim is what the victim-choice hook is told of an entry.
type Victim struct {
	Rel string
	// LastUse is the tick of its latest demand use (the read-ahead
	// clock's); for a background load no demand used yet, its
	// Background.LastUse.
	LastUse uint64
	Leased  bool // a lease or a request holds it
}

// Outcome is what became of a background load.
type Outcome uint8

// Outcomes of a background load.
const (
	// Started: the entry is made, loading.
	Started Outcome = iota + 1
	// Loaded: the load ended resident.
	Loaded
	// Staged: not started, the file is staged or loading already, or
	// held for its readers (staged after their last close).
	Staged
	// NoRoom: not started, or ended, for want of room (a demand waits
	// for room, the room allowed is not enough, the device is out of
	// memory).
	NoRoom
	// NotStaged: not started (not eligible, too large, failed before,
	// not admitted, the cache closed), or the load failed.
	NotStaged
	// Cancelled: the load stopped after CancelBackground.
	Cancelled
	// Left: the entry, loading or resident and never used, left the
	// cache (cancelled, evicted, invalidated).
	Left
)
