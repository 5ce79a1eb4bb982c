package readahead

import (
	"slices"
	"sync"
	"sync/atomic"

	"go.uber.org/zap"
)

// Kind says how a file was accessed.
type Kind uint8

// Kinds of access.
const (
	Open  Kind = iota // opened for reading through the mount
	Lease             // leased over the lease socket
)

// Event is one access: rel (clean, relative to SOURCE) accessed at At, a
// tick of the clock the cache stamps its entries' last use with (any
// non-decreasing count; Runner keeps one).
type Event struct {
	Rel  string
	Kind Kind
	At   uint64
}

// Item is one file planned for read-ahead. Heat is the tick of the
// access (or replay) that put it in the window: a read-ahead load counts
// as a use at Heat, and may displace only entries last used before every
// item's Heat (MayEvict).
type Item struct {
	Rel  string
	Size int64
	Heat uint64
}

// Plan is what the cache is asked to do after a call.
type Plan struct {
	// Stage: load these, in order, with read-ahead priority. Answer each
	// with Started then Loaded, or with Declined.
	Stage []Item
	// Cancel: abort these read-ahead loads (asked for earlier) unless a
	// demand access has joined them meanwhile. No answer is needed.
	Cancel []string
}

// Empty reports whether p asks for nothing.
func (p Plan) Empty() bool { return len(p.Stage) == 0 && len(p.Cancel) == 0 }

// Why says why the cache declined a read-ahead request.
type Why uint8

// Reasons for Declined.
const (
	Staged    Why = iota // already resident or loading for someone else
	NoRoom               // neither free room nor room MayEvict allows
	NotStaged            // not eligible, too large, failed, or the cache is closing
)

// state of an item.
type state uint8

const (
	planned  state = iota // in a Plan, no answer yet
	loading               // Started
	loaded                // Loaded: resident, nobody used it yet
	declined              // Declined, or evicted unused while in its window
)

// item is one read-ahead request, from the Plan that asked for it until
// someone uses the file, the cache evicts it, or it is cancelled.
type item struct {
	Item
	state  state
	owner  *dirState // the window holding it; nil: none (replay, or left its window)
	replay bool      // in the replay's flight
}

// Config is what New needs.
type Config struct {
	Options Options
	Tuning  Tuning // zero fields: DefaultTuning
	List    Lister
	Log     *zap.Logger
}

// ReadAhead is the detector and window planner. Its methods are meant to
// be called from one goroutine (Runner's); they may call List.
//
// Lock order: mu, then nothing. Window and Stats take no lock.
type ReadAhead struct {
	opts  Options
	tune  Tuning
	list  Lister
	log   *zap.Logger
	stats counters

	window atomic.Pointer[[]Item] // published at the end of every call

	mu     sync.Mutex
	seq    int64 // accesses seen
	uses   int64 // calls of dir, for forgetting the least recently used
	dirs   map[string]*dirState
	items  map[string]*item // INVARIANT: every item in a window or in flight is here
	replay replay
	// cancels decided outside replan (a directory forgotten), for the
	// next Plan.
	cancels []string
}

// New returns a detector with empty history.
func New(cfg Config) *ReadAhead {
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	if cfg.List == nil {
		cfg.List = func(string) ([]Entry, error) { return nil, nil }
	}
	r := &ReadAhead{
		opts: cfg.Options, tune: cfg.Tuning.withDefaults(), list: cfg.List,
		log: cfg.Log.Named("readahead"), dirs: map[string]*dirState{}, items: map[string]*item{},
	}
	r.window.Store(&[]Item{})
	return r
}

// Access records that ev.Rel was opened or leased, and replans.
func (r *ReadAhead) Access(ev Event) Plan {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seq++
	if it := r.items[ev.Rel]; it != nil {
		if it.state == loading || it.state == loaded {
			r.stats.hits.Add(1)
		}
		r.drop(it)
	}
	r.replay.accessed(ev.Rel)
	if r.opts.Files == 0 {
		return r.replan(ev.At) // read-ahead off: only a replay goes on
	}
	dir, name := split(ev.Rel)
	d := r.dir(dir)
	d.last = r.seq
	r.observe(d, name)
	return r.replan(ev.At)
}

// Started records that the cache began a read-ahead load of rel.
func (r *ReadAhead) Started(rel string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if it := r.items[rel]; it != nil && it.state == planned {
		it.state = loading
	}
	r.publish()
}

// Loaded records that a read-ahead load of rel completed (rel is
// resident, unused), and replans: a replay goes on.
func (r *ReadAhead) Loaded(rel string, at uint64) Plan {
	r.mu.Lock()
	defer r.mu.Unlock()
	it := r.items[rel]
	if it == nil {
		return r.replan(at)
	}
	it.state = loaded
	r.unflight(it)
	return r.replan(at)
}

// Declined records that the cache did not load rel for read-ahead.
// A replay stops at the first NoRoom.
func (r *ReadAhead) Declined(rel string, why Why, at uint64) Plan {
	r.mu.Lock()
	defer r.mu.Unlock()
	if it := r.items[rel]; it != nil {
		r.stats.declined.Add(1)
		if it.replay && why == NoRoom {
			r.replay.stop()
		}
		r.settle(it)
	}
	return r.replan(at)
}

// Evicted records that the cache dropped rel (evicted, invalidated or
// changed). A read-ahead file nobody used counts as wasted.
func (r *ReadAhead) Evicted(rel string, at uint64) Plan {
	r.mu.Lock()
	defer r.mu.Unlock()
	if it := r.items[rel]; it != nil && it.state == loaded {
		r.stats.wastedBytes.Add(uint64(it.Size))
		r.settle(it)
	}
	return r.replan(at)
}

// Changed drops what is known of rel's directory listing: it is listed
// again when next needed.
func (r *ReadAhead) Changed(rel string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	dir, _ := split(rel)
	if d := r.dirs[dir]; d != nil {
		d.list, d.missing = nil, nil
	}
}

// settle takes it out of flight: kept as declined while its window holds
// it (so the window does not ask again), forgotten otherwise.
func (r *ReadAhead) settle(it *item) {
	r.unflight(it)
	if it.owner == nil {
		delete(r.items, it.Rel)
		return
	}
	it.state = declined
}

// drop forgets it: used, or out of every window.
func (r *ReadAhead) drop(it *item) {
	r.unflight(it)
	if d := it.owner; d != nil {
		d.window = slices.DeleteFunc(d.window, func(x *item) bool { return x == it })
		it.owner = nil
	}
	delete(r.items, it.Rel)
}

// dir returns the state of dir, making it (and forgetting the least
// recently used directory beyond Tuning.Dirs).
func (r *ReadAhead) dir(dir string) *dirState {
	r.uses++
	if d := r.dirs[dir]; d != nil {
		d.used = r.uses
		return d
	}
	if len(r.dirs) >= r.tune.Dirs {
		var old *dirState
		for _, d := range r.dirs {
			if old == nil || d.used < old.used {
				old = d
			}
		}
		r.forgetDir(old)
	}
	d := &dirState{dir: dir, log: newHistory(r.tune.History), used: r.uses}
	r.dirs[dir] = d
	return d
}

// forgetDir drops d and its window (cancelling what is in flight).
func (r *ReadAhead) forgetDir(d *dirState) {
	var p Plan
	r.shrink(d, nil, &p)
	r.cancels = append(r.cancels, p.Cancel...)
	delete(r.dirs, d.dir)
}

// Learn records orders seen before (a trace) without accessing anything:
// later accesses that follow them predict what came next in them. What it
// cancels (a directory forgotten to make room) comes with the next Plan.
func (r *ReadAhead) Learn(rels []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.learnLocked(rels)
}

// learnLocked is Learn; r.mu must be held.
func (r *ReadAhead) learnLocked(rels []string) {
	for _, rel := range rels {
		dir, name := split(rel)
		d := r.dir(dir)
		if !d.log.recent(name, 1) {
			d.log.append(name)
		}
	}
}

// Window returns the items planned now (in flight or resident and
// waiting for their reader), for MayEvict. It takes no lock.
func (r *ReadAhead) Window() []Item { return *r.window.Load() }
