package readahead

import "sync"

// replay is a trace being staged in its order, paced by the window: at
// most the window's files and bytes are in flight (asked for and not yet
// loaded) at once; loaded files leave the flight, so the whole trace is
// staged, as far as room allows, without flooding the device.
//
// Every field but wanted is guarded by ReadAhead.mu.
type replay struct {
	queue   []string        // rels not yet asked for, in order
	pending map[string]bool // rels in queue nobody accessed since
	heat    uint64
	flight  map[string]*item // asked for, not yet loaded or declined
	bytes   int64            // sizes in flight, added up

	// wanted is pending and flight (and what Runner.Replay was given and
	// the detector has not seen yet) by name, for Wanted: it is read
	// without ReadAhead.mu, which may be held across a directory listing.
	wantMu sync.Mutex      // a leaf
	wanted map[string]bool // guarded by wantMu
}

func (p *replay) active() bool { return len(p.pending) > 0 || len(p.flight) > 0 }

// accessed takes rel off the queue: its reader got there first.
func (p *replay) accessed(rel string) {
	delete(p.pending, rel)
	p.sync(rel)
}

// stop drops what was not asked for yet (no room is left for it).
func (p *replay) stop() {
	p.queue, p.pending = nil, nil
	p.wantMu.Lock()
	p.wanted = make(map[string]bool, len(p.flight))
	for rel := range p.flight {
		p.wanted[rel] = true
	}
	p.wantMu.Unlock()
}

// want marks rels wanted before the detector sees them.
func (p *replay) want(rels []string) {
	p.wantMu.Lock()
	defer p.wantMu.Unlock()
	if p.wanted == nil {
		p.wanted = map[string]bool{}
	}
	for _, rel := range rels {
		p.wanted[rel] = true
	}
}

// sync makes wanted agree with pending and flight for rel. ReadAhead.mu
// must be held.
func (p *replay) sync(rel string) {
	p.wantMu.Lock()
	defer p.wantMu.Unlock()
	if p.pending[rel] || p.flight[rel] != nil {
		if p.wanted == nil {
			p.wanted = map[string]bool{}
		}
		p.wanted[rel] = true
	} else {
		delete(p.wanted, rel)
	}
}

// Wanted reports whether a replay has yet to stage rel: queued, or asked
// for and not yet loaded or declined. The cache shows such a file as
// loading. It takes only a leaf lock.
func (r *ReadAhead) Wanted(rel string) bool {
	p := &r.replay
	p.wantMu.Lock()
	defer p.wantMu.Unlock()
	return p.wanted[rel]
}

// unflight takes it out of the replay's flight, if it is in it.
func (r *ReadAhead) unflight(it *item) {
	if !it.replay {
		return
	}
	it.replay = false
	delete(r.replay.flight, it.Rel)
	r.replay.bytes -= it.Size
	r.replay.sync(it.Rel)
}

// Replay stages rels in their order through the window, and learns the
// order (Learn). at is the replay's tick: every item it plans has that
// Heat. Rels already queued are not queued again.
func (r *ReadAhead) Replay(rels []string, at uint64) Plan {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.learnLocked(rels)
	q := &r.replay
	if q.pending == nil {
		q.pending = map[string]bool{}
	}
	if q.flight == nil {
		q.flight = map[string]*item{}
	}
	for _, rel := range rels {
		if !q.pending[rel] {
			q.pending[rel] = true
			q.queue = append(q.queue, rel)
		}
		q.sync(rel)
	}
	q.heat = at
	return r.replan(at)
}

// pace asks for the replay's next files while its flight stays within
// files and bytes.
func (r *ReadAhead) pace(files int, bytes int64, p *Plan) {
	q := &r.replay
	_, limit := r.budget()
	for len(q.queue) > 0 && len(q.flight) < files {
		rel := q.queue[0]
		if !q.pending[rel] || r.items[rel] != nil {
			q.queue = q.queue[1:]
			delete(q.pending, rel)
			q.sync(rel)
			continue
		}
		dir, name := split(rel)
		size, listed := r.listed(r.dir(dir), name).size(name)
		if !listed || size > limit {
			q.queue = q.queue[1:]
			delete(q.pending, rel)
			q.sync(rel)
			r.stats.replaySkipped.Add(1)
			continue
		}
		if q.bytes+size > bytes {
			break
		}
		q.queue = q.queue[1:]
		delete(q.pending, rel)
		it := &item{Item: Item{Rel: rel, Size: size, Heat: q.heat}, replay: true}
		r.items[rel] = it
		q.flight[rel] = it
		q.bytes += size
		q.sync(rel)
		p.Stage = append(p.Stage, it.Item)
		r.stats.issued.Add(1)
	}
}
