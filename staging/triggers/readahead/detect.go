package readahead

import "go.uber.org/zap"

// dirState is what the detector knows of one directory.
type dirState struct {
	dir     string
	list    *listing        // nil: not listed yet, or dropped by Changed
	missing map[string]bool // names absent from list when it was made
	name    run             // name order, positions in list
	hist    run             // an order seen before, positions in log
	log     *history
	last    int64   // ReadAhead.seq of the latest access here
	used    int64   // ReadAhead.uses when last accessed, learnt or replayed
	window  []*item // the read-ahead planned for this directory, in order
}

// listed returns d's listing, making it when missing or when name (if
// not "") is absent from it and was not absent from the last listing.
func (r *ReadAhead) listed(d *dirState, name string) *listing {
	if d.list != nil && (name == "" || d.missing[name]) {
		return d.list
	}
	if d.list != nil {
		if _, ok := d.list.index[name]; ok {
			return d.list
		}
	}
	entries, err := r.list(d.dir)
	if err != nil {
		r.log.Debug("list", zap.String("dir", d.dir), zap.Error(err))
		entries = nil
	}
	d.list, d.missing = newListing(entries), map[string]bool{}
	if _, ok := d.list.index[name]; name != "" && !ok {
		d.missing[name] = true
	}
	return d.list
}

// observe moves d's runs for an access of name.
func (r *ReadAhead) observe(d *dirState, name string) {
	l := r.listed(d, name)
	slack := r.slack(len(l.names))
	lim := r.limits(len(l.names))
	if i, ok := l.index[name]; ok {
		d.name.step(int64(i), lim)
	}
	// The order seen before keeps the widest spread name order measured
	// while it followed the readers (run.carried).
	defer func() {
		if d.hist.valid {
			d.hist.carried = max(d.hist.carried, r.spread(&d.name, len(l.names)))
		}
	}()
	if d.log.recent(name, 2*slack) {
		return // a re-open: nothing new
	}
	cands := d.log.occurrences(name)
	if len(cands) == 0 {
		d.hist = run{} // never seen here: the order seen before is left
	} else {
		d.hist.stepAny(cands, lim)
	}
	d.log.append(name)
}

// slack is Tuning.Slack for a directory of n files: a sixteenth of them,
// at least 2 (two readers racing swap neighbours). Readers following one
// order may spread 4×slack ahead of the slowest (limits). In a small
// directory a wide slack makes chance runs in random order likely.
func (r *ReadAhead) slack(n int) int {
	return max(2, min(r.tune.Slack, n/16))
}

// limits are the spread allowed to readers following one order in a
// directory of n files: re-opens up to 2×slack behind the slowest
// reader; new positions up to 4×slack beyond it, but no more than n/8
// (in a small directory a wide reach lets random order fill a prefix);
// once a run is sure, as far as its readers spread, up to n/4 (from 64
// files on).
func (r *ReadAhead) limits(n int) limits {
	slack := int64(r.slack(n))
	lim := limits{back: 2 * slack, ahead: max(slack, min(4*slack, int64(n/8))), minRun: r.minRun(n), wide: int64(n / 4)}
	if n < 64 {
		lim.back, lim.wide = slack, 0 // no wider than the young run's
	}
	return lim
}

// MinDirFiles: a directory of fewer files is never read ahead by the
// detector (too few to tell an order from chance; a replay still stages
// them).
const MinDirFiles = 16

// minRun is Tuning.MinRun, one more in a directory of fewer than 32
// files, where the slack is a larger share of the files.
func (r *ReadAhead) minRun(n int) int {
	if n < 32 {
		return r.tune.MinRun + 1
	}
	return r.tune.MinRun
}

func (d *dirState) listOrEmpty() *listing {
	if d.list == nil {
		return &listing{}
	}
	return d.list
}

// guess is one predicted file.
type guess struct {
	rel  string
	size int64
}

// predict returns the files d's readers are expected to open next, best
// first: the order seen before when it is followed, else name order; and
// how many files the readers spread over (spread, 0 unless several
// readers follow the order): as name order measures it, or, where the
// order seen before predicts, the widest it was while that run followed
// them. It returns up to max(n, spread) files.
func (r *ReadAhead) predict(d *dirState, n int) (out []guess, spread int) {
	if n <= 0 || r.seq-d.last > int64(r.tune.Idle) {
		return nil, 0
	}
	files := len(d.listOrEmpty().names)
	if files < MinDirFiles {
		return nil, 0
	}
	minRun := r.minRun(files)
	hist, byName := d.hist.confident(minRun), d.name.confident(minRun)
	if !hist && !byName {
		return nil, 0
	}
	l := r.listed(d, "")
	s := r.spread(&d.name, files)
	if hist {
		hs := max(s, d.hist.carried)
		if g := r.predictHistory(d, l, max(n, hs)); len(g) > 0 {
			return g, hs
		}
	}
	if !byName {
		return nil, 0
	}
	for _, i := range d.name.next(max(n, s), int64(len(l.names))) {
		out = append(out, guess{join(d.dir, l.names[i]), l.sizes[i]})
	}
	return out, s
}

// spread is how many files the readers of rn (d's name-order run) spread
// over, in a directory of n files: 0 for a lone reader (reach 0) or a run
// not sure yet; else reach+1 (from the slowest reader's position to the
// furthest a reader went beyond it), as far as the run follows its
// readers (a quarter of the directory from 64 files on, its young limit
// below) and at most MaxFiles. The readers take the files of that stretch
// nobody accessed yet next, and the window holds at least as many. Only
// name order measures it: a name has up to maxOccurrences positions in the
// order seen before and that run takes whichever fits, so in random order
// its reach grows by chance.
func (r *ReadAhead) spread(rn *run, n int) int {
	if !rn.valid || !rn.sure || rn.reach == 0 {
		return 0
	}
	lim := r.limits(n)
	return int(min(rn.reach+1, max(lim.ahead, lim.wide), MaxFiles))
}

// predictHistory walks d's log forward from the history run's low,
// skipping positions the run accessed, names seen twice and names no
// longer listed.
func (r *ReadAhead) predictHistory(d *dirState, l *listing, n int) []guess {
	var out []guess
	seen := map[string]bool{}
	limit := d.hist.low + int64(4*n+r.tune.Slack)
	for p := d.hist.low; p < d.log.n && p <= limit && len(out) < n; p++ {
		name, ok := d.log.at(p)
		if !ok || seen[name] || d.hist.done[p] {
			continue
		}
		seen[name] = true
		if size, ok := l.size(name); ok {
			out = append(out, guess{join(d.dir, name), size})
		}
	}
	return out
}
