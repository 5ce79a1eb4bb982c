package staging

import (
	"sync"
	"time"
)

// Event is one change of an entry's state, as Subscribe delivers it.
type Event struct {
	Rel        string // SOURCE-relative path
	State      string // StateAbsent, StateLoading, StateResident or StateFailed
	Generation uint64 // the staging this event is about
	Device     string // where it is (or was) staged
	LoadPath   string // resident, failed: the load path taken or attempted
	Bytes      int64  // the file's size
	// Duration is the load's, on resident and failed; 0 otherwise.
	Duration time.Duration
	// Err is why, on failed, and on absent for a queued file that was
	// not staged (no entry was made: ENOENT, ENOSPC, ...).
	Err error
	// Reason says why an entry left (absent: "evicted", "changed",
	// "gone", "failed load dropped", ...) or, on resident, why cuFile was
	// not used.
	Reason string
	// HandedOver: resident because Adopt took it over from the
	// predecessor daemon (nothing was loaded; Duration is 0).
	HandedOver bool
}

// events delivers Events to subscribers from one goroutine, in the order
// they were emitted (emission happens under Cache.mu, so per entry this is
// the order of its state changes). The queue is unbounded: emitting never
// blocks a state change.
type events struct {
	mu     sync.Mutex // guards the fields below; taken after Cache.mu
	queue  []queued
	seq    uint64 // events emitted so far
	subs   map[uint64]*subscriber
	nextID uint64
	closed bool

	wake chan struct{} // capacity 1: the dispatcher has work
	done chan struct{} // closed when the dispatcher returned
}

type queued struct {
	seq uint64
	e   Event
}

type subscriber struct {
	fn   func(Event)
	from uint64 // the first event number it gets
	mu   sync.Mutex
	on   bool // guarded by mu; false once cancelled
}

func newEvents() *events {
	ev := &events{subs: map[uint64]*subscriber{}, wake: make(chan struct{}, 1), done: make(chan struct{})}
	go ev.dispatch()
	return ev
}

// Subscribe calls fn with every state change of every entry from now on,
// outside Cache.mu, in order per entry, from one goroutine (a slow fn
// delays later events, never staging). fn may call the Cache. cancel stops
// the calls; a call already running finishes. Events stop after Close.
func (c *Cache) Subscribe(fn func(Event)) (cancel func()) {
	ev := c.events
	ev.mu.Lock()
	defer ev.mu.Unlock()
	id := ev.nextID
	ev.nextID++
	s := &subscriber{fn: fn, from: ev.seq + 1, on: true}
	if !ev.closed {
		ev.subs[id] = s
	}
	return func() {
		s.mu.Lock()
		s.on = false
		s.mu.Unlock()
		ev.mu.Lock()
		delete(ev.subs, id)
		ev.mu.Unlock()
	}
}

// emitLocked queues e for the subscribers. Cache.mu must be held: that is
// what orders an entry's events.
func (c *Cache) emitLocked(e Event) {
	c.noteAbsentLocked(e)
	ev := c.events
	ev.mu.Lock()
	ev.seq++
	if len(ev.subs) > 0 && !ev.closed {
		ev.queue = append(ev.queue, queued{ev.seq, e})
	}
	ev.mu.Unlock()
	select {
	case ev.wake <- struct{}{}:
	default:
	}
}

// eventLocked is an event about e entering state. Cache.mu must be
// held.
func (e *entry) eventLocked(st state, reason string) Event {
	ev := Event{
		Rel: e.rel, State: st.String(), Generation: e.gen, Device: e.slot.dev.Name(),
		Bytes: e.id.size, Reason: reason,
	}
	if st == stResident || st == stFailed {
		ev.LoadPath, ev.Duration, ev.Err = e.path, e.loadDur, e.err
	}
	return ev
}

func (ev *events) dispatch() {
	defer close(ev.done)
	for range ev.wake {
		for {
			ev.mu.Lock()
			batch := ev.queue
			ev.queue = nil
			subs := make([]*subscriber, 0, len(ev.subs))
			for _, s := range ev.subs {
				subs = append(subs, s)
			}
			closed := ev.closed
			ev.mu.Unlock()
			if len(batch) == 0 {
				if closed {
					return
				}
				break
			}
			for _, q := range batch {
				for _, s := range subs {
					s.deliver(q.seq, q.e)
				}
			}
		}
	}
}

func (s *subscriber) deliver(seq uint64, e Event) {
	if seq < s.from {
		return
	}
	s.mu.Lock()
	on := s.on
	s.mu.Unlock()
	if on {
		s.fn(e)
	}
}

// close delivers what is queued, then stops the dispatcher and waits for
// it. Nothing may be emitted after.
func (ev *events) close() {
	ev.mu.Lock()
	ev.closed = true
	ev.mu.Unlock()
	select {
	case ev.wake <- struct{}{}:
	default:
	}
	<-ev.done
}

// maxAbsentWhy bounds the reasons AbsentReason remembers.
const maxAbsentWhy = 4096

// noteAbsentLocked remembers why e.Rel became absent (evicted, changed,
// not staged: no room, ...) until it loads again. Cache.mu must be held.
func (c *Cache) noteAbsentLocked(e Event) {
	if e.State != StateAbsent {
		delete(c.absentWhy, e.Rel)
		return
	}
	why := e.Reason
	if why == "" && e.Err != nil {
		why = e.Err.Error()
	}
	if why == "" {
		return
	}
	if len(c.absentWhy) >= maxAbsentWhy {
		clear(c.absentWhy)
	}
	c.absentWhy[e.Rel] = why
}

// AbsentReason is why rel last became absent ("evicted", "not staged:
// ...", "changed", ...), or "" when it is not absent or the reason is not
// known (never staged, or forgotten among many).
func (c *Cache) AbsentReason(rel string) string {
	c.lock()
	defer c.unlock()
	if state, _ := c.attrLocked(rel); state != StateAbsent {
		return ""
	}
	return c.absentWhy[rel]
}
