package readahead

// run follows readers moving through one order together: one reader, or
// several (DataLoader workers, each fetching its own items, or batches of
// them, at its own pace) spread over a stretch of the order that moves
// forward. It does not follow a single position: it keeps which
// positions were accessed since the run began, and low, the first one not
// accessed yet. Every reader is at or beyond low (the slowest one is
// about to take it); what read-ahead plans is the positions from low on
// that nobody accessed yet, so a faster reader going past a planned file
// never takes it out of the plan: only its access, or a jump, does.
//
// INVARIANT: the positions accessed in the run are [first, low) and done;
// every position in done is beyond low.
type run struct {
	valid bool
	ref   int64 // the run's first access
	first int64 // the lowest position accessed
	low   int64 // the first position at or after first not accessed
	done  map[int64]bool
	stall int   // new positions accessed since low last moved
	reach int64 // the furthest beyond low a new position was accessed
	sure  bool  // confident once: the limits follow reach
	// A sure run of several readers: the accesses that did not fit, as a
	// run of their own, and how many more of them than of accesses that
	// fit came lately (each fit takes one off).
	alt    *run
	strays int
	// carried: the most files the readers were seen to spread over in
	// name order while this run (of the order seen before) followed them;
	// it carries that spread across the epoch's wrap-around, where name
	// order restarts.
	carried int
}

// limits are how far the accesses of readers following one order spread.
type limits struct {
	// back: an access up to back places before low is a re-open (or,
	// while the run is young, a reader that started behind the first
	// access); further back is a jump.
	back int64
	// ahead: a new position up to ahead places beyond low is one of the
	// readers; further is a jump. Also the most new positions accessed
	// while low stays put (the slowest reader holds it): random order
	// fills no prefix and restarts.
	ahead int64
	// minRun: the run is confident once its first minRun+1 positions
	// are accessed; from then on its readers may spread up to twice as
	// far as they did (reach): a run that proved itself follows many
	// workers' batches, while a lone reader's jump is still one. At
	// most wide places, though (in a small directory a wide reach lets
	// random order fill a prefix).
	minRun int
	wide   int64
}

// start begins a run at p.
func (r *run) start(p int64) {
	*r = run{valid: true, ref: p, first: p, low: p + 1}
}

// fits reports whether p is where r's readers may be, within lim (already
// widened): at most back before low, at most ahead beyond it, and, before
// the run's lowest position, at most ahead before its first access.
func (r *run) fits(p int64, lim limits) bool {
	return p >= r.low-lim.back && p <= r.low+lim.ahead && (p >= r.first || p >= r.ref-lim.ahead)
}

// reopen reports whether p was accessed in r.
func (r *run) reopen(p int64) bool { return r.done[p] || p >= r.first && p < r.low }

// step moves r for an access at position p.
func (r *run) step(p int64, lim limits) {
	if !r.valid {
		r.start(p)
		return
	}
	wide := r.widen(lim)
	switch {
	case !r.fits(p, wide):
		r.jump(lim, func(a *run) { a.step(p, lim) }, p)
		return
	case r.reopen(p):
	case p < r.first && !r.sure:
		r.behind(p)
	case p < r.first:
		// Behind a sure run's first access: a reader the run never knew
		// (it began at a stray); its window stays ahead.
	default:
		r.ahead(p, wide)
	}
	r.strays = max(0, r.strays-1)
	r.sure = r.sure || r.confident(lim.minRun)
}

// widen returns lim for r: once r is sure, its readers may spread up to
// twice as far as they did.
func (r *run) widen(lim limits) limits {
	if r.sure {
		lim.back = max(lim.back, min(r.reach, lim.wide))
		lim.ahead = max(lim.ahead, min(2*r.reach, lim.wide))
	}
	return lim
}

// jump handles an access that does not fit r, at position p (alt steps
// an alternative run for it). A lone reader's run (reach 0), or one not
// sure yet, restarts at p. A sure run of several readers does not give
// up its window for one reader far ahead (many workers' batches spread
// far): it follows the stray accesses in an alternative run and gives way
// to it when the strays prove a real jump: more than minRun of them
// (less one per access that fit) with the alternative confident, or more
// than the reach.
func (r *run) jump(lim limits, alt func(*run), p int64) {
	if !r.sure || r.reach == 0 {
		r.start(p)
		return
	}
	if r.alt == nil {
		r.alt = &run{}
	}
	alt(r.alt)
	r.strays++
	if r.strays > lim.minRun && r.alt.confident(lim.minRun) || int64(r.strays) > r.widen(lim).ahead {
		a := *r.alt
		a.alt, a.strays = nil, 0
		*r = a
	}
}

// ahead records a new position p beyond low.
func (r *run) ahead(p int64, lim limits) {
	if r.done == nil {
		r.done = map[int64]bool{}
	}
	r.done[p] = true
	r.reach = max(r.reach, p-r.low)
	old := r.low
	for r.done[r.low] {
		delete(r.done, r.low)
		r.low++
	}
	if r.low != old {
		r.stall = 0
		return
	}
	if r.stall++; int64(r.stall) > lim.ahead { // random order, or one reader moved on
		r.start(p)
	}
}

// behind records a new position p before first, within back of low and
// ahead of the first access (the run is young: the first reader's access
// arrived before a slower one's lower position).
func (r *run) behind(p int64) {
	if p+1 < r.first {
		// A hole between p and first: [first, low) moves into done.
		if r.done == nil {
			r.done = map[int64]bool{}
		}
		for q := r.first; q < r.low; q++ {
			r.done[q] = true
		}
		r.low = p + 1
	}
	r.first = p
}

// confident reports whether r has gone on long enough to predict: its
// first minRun+1 positions all accessed, and low beyond the run's first
// access by minRun-1 (so that readers going backwards do not qualify).
func (r *run) confident(minRun int) bool {
	return r.valid && r.low-r.first > int64(minRun) && r.low-r.ref >= int64(minRun-1)
}

// next returns up to n positions from low on that r has not accessed, in
// order, below end.
func (r *run) next(n int, end int64) []int64 {
	var out []int64
	for p := r.low; p < end && len(out) < n; p++ {
		if !r.done[p] {
			out = append(out, p)
		}
	}
	return out
}

// stepAny moves r for an access that stands at any of the positions
// cands (a name seen several times before): the new position nearest low
// that fits, else a re-open, else a jump to the latest.
func (r *run) stepAny(cands []int64, lim limits) {
	if len(cands) == 0 {
		return
	}
	wide := r.widen(lim)
	best, reopen := int64(-1), false
	for _, q := range cands {
		switch {
		case !r.valid || !r.fits(q, wide):
		case r.reopen(q):
			reopen = true
		case best < 0 || abs(q-r.low) < abs(best-r.low):
			best = q
		}
	}
	switch {
	case best >= 0:
		r.step(best, lim)
	case reopen:
		r.strays = max(0, r.strays-1)
	case !r.valid:
		r.start(cands[len(cands)-1])
	default:
		r.jump(lim, func(a *run) { a.stepAny(cands, lim) }, cands[len(cands)-1])
	}
}

func abs(x int64) int64 {
	if x < 0 {
		return -x
	}
	return x
}
