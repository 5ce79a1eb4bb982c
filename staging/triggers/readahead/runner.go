package readahead

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
)

// QueueLimit bounds the accesses waiting for the detector; more are
// dropped (counted as readahead_dropped), never waited for.
const QueueLimit = 4096

// Runner puts the detector beside the cache: the cache's open and lease
// paths and its loads push events without waiting (a short mutex, no
// I/O), and one goroutine (Run) feeds them to the detector in arrival
// order and hands each Plan to the cache. It keeps the clock that stamps
// accesses, and the trace.
//
// Lock order: Runner.mu, then nothing. The cache may push while holding
// its own lock.
type Runner struct {
	ra    *ReadAhead
	trace *Recorder // nil: no trace recorded
	clock atomic.Uint64
	wake  chan struct{}

	mu       sync.Mutex
	queue    []event
	accesses int // accesses in queue; INVARIANT: accesses <= QueueLimit
}

type evKind uint8

const (
	evAccess evKind = iota
	evStarted
	evLoaded
	evDeclined
	evEvicted
	evChanged
	evReplay
	evLearn
)

type event struct {
	kind evKind
	ev   Event
	why  Why
	rels []string
}

// NewRunner runs ra, recording a trace in rec (nil: none).
func NewRunner(ra *ReadAhead, rec *Recorder) *Runner {
	return &Runner{ra: ra, trace: rec, wake: make(chan struct{}, 1)}
}

// Tick advances the clock and returns the new tick (the first is 1).
func (r *Runner) Tick() uint64 { return r.clock.Add(1) }

// Opened records that rel was opened for reading through the mount and
// returns the tick the cache stamps rel's entry with. It never blocks.
func (r *Runner) Opened(rel string) uint64 { return r.access(rel, Open) }

// Leased records that rel was leased; as Opened.
func (r *Runner) Leased(rel string) uint64 { return r.access(rel, Lease) }

func (r *Runner) access(rel string, k Kind) uint64 {
	at := r.Tick()
	r.trace.Add(rel)
	r.mu.Lock()
	if r.accesses >= QueueLimit {
		r.mu.Unlock()
		r.ra.stats.dropped.Add(1)
		return at
	}
	r.accesses++
	r.queue = append(r.queue, event{kind: evAccess, ev: Event{Rel: rel, Kind: k, At: at}})
	r.mu.Unlock()
	r.signal()
	return at
}

// Started: the cache began the read-ahead load of rel. Push it while the
// entry is made (under the cache's lock), so an access racing with it
// counts as a hit.
func (r *Runner) Started(rel string) { r.push(event{kind: evStarted, ev: Event{Rel: rel}}) }

// Loaded: the read-ahead load of rel completed.
func (r *Runner) Loaded(rel string) { r.push(event{kind: evLoaded, ev: Event{Rel: rel}}) }

// Declined: the cache did not load rel for read-ahead.
func (r *Runner) Declined(rel string, why Why) {
	r.push(event{kind: evDeclined, ev: Event{Rel: rel}, why: why})
}

// Evicted: the cache dropped rel's entry (evicted, invalidated, changed).
func (r *Runner) Evicted(rel string) { r.push(event{kind: evEvicted, ev: Event{Rel: rel}}) }

// Changed: rel was changed through the mount (its directory is listed
// again when next needed).
func (r *Runner) Changed(rel string) { r.push(event{kind: evChanged, ev: Event{Rel: rel}}) }

// Replay stages rels in order through the window (ReadAhead.Replay).
// They are Wanted from now on, until staged, declined or accessed.
func (r *Runner) Replay(rels []string) {
	r.ra.replay.want(rels)
	r.push(event{kind: evReplay, ev: Event{At: r.Tick()}, rels: rels})
}

// Wanted is ReadAhead.Wanted.
func (r *Runner) Wanted(rel string) bool { return r.ra.Wanted(rel) }

// push queues a cache event; these are never dropped (each answers a
// request of a Plan, so there are no more of them than requests).
func (r *Runner) push(e event) {
	r.mu.Lock()
	r.queue = append(r.queue, e)
	r.mu.Unlock()
	r.signal()
}

func (r *Runner) signal() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// Drain feeds the queued events to the detector and returns their Plans
// merged: a file asked for and cancelled within one Drain is neither.
func (r *Runner) Drain() Plan {
	r.mu.Lock()
	q := r.queue
	r.queue, r.accesses = nil, 0
	r.mu.Unlock()
	var out Plan
	for _, e := range q {
		var p Plan
		switch e.kind {
		case evAccess:
			p = r.ra.Access(e.ev)
		case evStarted:
			r.ra.Started(e.ev.Rel)
		case evLoaded:
			p = r.ra.Loaded(e.ev.Rel, r.clock.Load())
		case evDeclined:
			p = r.ra.Declined(e.ev.Rel, e.why, r.clock.Load())
		case evEvicted:
			p = r.ra.Evicted(e.ev.Rel, r.clock.Load())
		case evChanged:
			r.ra.Changed(e.ev.Rel)
		case evReplay:
			p = r.ra.Replay(e.rels, e.ev.At)
		case evLearn:
			r.ra.Learn(e.rels)
		}
		out = merge(out, p)
	}
	return out
}

// merge applies q after p.
func merge(p, q Plan) Plan {
	for _, rel := range q.Cancel {
		if i := slices.IndexFunc(p.Stage, func(it Item) bool { return it.Rel == rel }); i >= 0 {
			p.Stage = slices.Delete(p.Stage, i, i+1)
		} else if !slices.Contains(p.Cancel, rel) {
			p.Cancel = append(p.Cancel, rel)
		}
	}
	for _, it := range q.Stage {
		if i := slices.Index(p.Cancel, it.Rel); i >= 0 {
			p.Cancel = slices.Delete(p.Cancel, i, i+1) // the earlier load goes on
		} else {
			p.Stage = append(p.Stage, it)
		}
	}
	return p
}

// Run drains events as they come and hands each non-empty Plan to act,
// until ctx is done. act must not block (it starts loads and cancels).
func (r *Runner) Run(ctx context.Context, act func(Plan)) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.wake:
		}
		if p := r.Drain(); !p.Empty() {
			act(p)
		}
	}
}

// Window is ReadAhead.Window.
func (r *Runner) Window() []Item { return r.ra.Window() }

// Stats is ReadAhead.Stats.
func (r *Runner) Stats() Stats { return r.ra.Stats() }

// Trace is the recorder (nil when no trace is recorded).
func (r *Runner) Trace() *Recorder { return r.trace }
