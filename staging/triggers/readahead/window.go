package readahead

import (
	"math"
	"sort"
)

// budget is the window's bound: read-ahead off still paces a replay one
// file at a time.
func (r *ReadAhead) budget() (files int, bytes int64) {
	files, bytes = r.opts.Files, int64(r.opts.Bytes)
	if files == 0 {
		files = 1
	}
	if bytes == 0 {
		bytes = math.MaxInt64
	}
	return files, bytes
}

// replan recomputes every window for what the detector predicts now,
// shares the bound among the directories that predict (most recently
// accessed first) and the replay, and returns the difference as a Plan.
// A directory whose readers spread over more files than its share
// (predict's spread) takes as many beyond it, without taking another
// directory's share or the replay's; MaxFiles bounds the files of all
// windows and the replay's flight together.
// r.mu must be held.
func (r *ReadAhead) replan(at uint64) Plan {
	p := Plan{Cancel: r.cancels}
	r.cancels = nil
	files, bytes := r.budget()
	type want struct {
		d       *dirState
		guesses []guess
		spread  int // the files its readers spread over (0: one reader)
	}
	var active []want
	if r.opts.Files > 0 {
		for _, d := range r.dirs {
			if g, s := r.predict(d, files); len(g) > 0 {
				active = append(active, want{d, g, s})
			}
		}
	}
	sort.Slice(active, func(i, j int) bool { return active[i].d.last > active[j].d.last })
	k := len(active)
	if r.replay.active() {
		k++
	}
	var stopped []*dirState // windows of directories that stopped predicting
	for _, d := range r.dirs {
		if len(d.window) > 0 && !contains(active, func(w want) bool { return w.d == d }) {
			stopped = append(stopped, d)
		}
	}
	sort.Slice(stopped, func(i, j int) bool { return stopped[i].used < stopped[j].used })
	for _, d := range stopped {
		r.setWindow(d, nil, at, &p)
	}
	// usedFiles counts the files taken within the shares (what is left
	// of files goes to the replay); allFiles counts every file taken.
	// shared counts the shares given out so far: files-shared is
	// reserved for the windows after this one and the replay.
	usedFiles, allFiles, usedBytes, shared := 0, 0, int64(0), 0
	for i, w := range active {
		share := files / k
		if i < files%k {
			share++
		}
		shared += share
		// Readers spread over more files than the share: the window
		// covers them, out of what MaxFiles leaves beside every other
		// share (one directory's readers never take another's).
		nf := min(max(share, w.spread), MaxFiles-allFiles-(files-shared))
		var take []guess
		var sum int64
		for _, g := range w.guesses {
			if len(take) >= nf || sum+g.size > bytes/int64(k) {
				break
			}
			take = append(take, g)
			sum += g.size
		}
		r.setWindow(w.d, take, at, &p)
		usedFiles += min(len(take), share)
		allFiles += len(take)
		usedBytes += sum
	}
	r.pace(min(files-usedFiles, MaxFiles-allFiles), bytes-usedBytes, &p)
	p.Cancel = append(p.Cancel, r.cancels...) // directories forgotten meanwhile
	r.cancels = nil
	r.publish()
	return p
}

func contains[T any](s []T, f func(T) bool) bool {
	for _, x := range s {
		if f(x) {
			return true
		}
	}
	return false
}

// setWindow makes d's window take, in that order: what falls out is
// cancelled (in flight) or let go (loaded); what comes in is adopted
// (already loaded, or in the replay's flight) or asked for.
func (r *ReadAhead) setWindow(d *dirState, take []guess, at uint64, p *Plan) {
	keep := make(map[string]bool, len(take))
	for _, g := range take {
		keep[g.rel] = true
	}
	r.shrink(d, keep, p)
	w := make([]*item, 0, len(take))
	for _, g := range take {
		it := r.items[g.rel]
		switch {
		case it != nil && it.owner == d:
		case it != nil:
			r.unflight(it)
			it.owner = d
		default:
			it = &item{Item: Item{Rel: g.rel, Size: g.size, Heat: at}, owner: d}
			r.items[g.rel] = it
			p.Stage = append(p.Stage, it.Item)
			r.stats.issued.Add(1)
		}
		w = append(w, it)
	}
	d.window = w
}

// shrink lets go of the items of d's window that keep does not name.
func (r *ReadAhead) shrink(d *dirState, keep map[string]bool, p *Plan) {
	for _, it := range d.window {
		if keep[it.Rel] {
			continue
		}
		it.owner = nil
		switch it.state {
		case loaded:
			continue // resident: stays, colder than what comes next
		case loading:
			r.stats.wastedBytes.Add(uint64(it.Size))
			fallthrough
		case planned:
			p.Cancel = append(p.Cancel, it.Rel)
			r.stats.cancelled.Add(1)
		}
		delete(r.items, it.Rel)
	}
	d.window = nil
}

// publish stores the window for MayEvict and the gauges for Stats.
// r.mu must be held.
func (r *ReadAhead) publish() {
	var w []Item
	for _, d := range r.dirs {
		for _, it := range d.window {
			if it.state != declined {
				w = append(w, it.Item)
			}
		}
	}
	for _, it := range r.replay.flight {
		w = append(w, it.Item)
	}
	sort.Slice(w, func(i, j int) bool { return w[i].Rel < w[j].Rel })
	r.window.Store(&w)
	r.stats.replayPending.Store(int64(len(r.replay.pending)))
}
