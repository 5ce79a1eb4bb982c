package readahead

import "go.uber.org/zap"

// cursor follows one sequence: its position, how many accesses in a row
// continued it, and the stride they took.
type cursor struct {
	valid  bool
	pos    int64
	run    int   // continuing accesses since the last jump
	stride int64 // the stride every advance of the run took; 0: none yet; -1: mixed
}

// step moves c for an access at position to. Ahead of the furthest
// position reached by 1..slack continues the sequence; behind it by
// 0..2*slack (a re-open, readers racing: a DataLoader keeps two items per
// worker in flight, so the furthest runs up to twice the workers ahead of
// the slowest) is tolerated; anything else is a jump.
func (c *cursor) step(to int64, slack int) {
	d := to - c.pos
	switch {
	case !c.valid:
		*c = cursor{valid: true, pos: to}
	case d > 0 && d <= int64(slack):
		c.run++
		c.pos = to
		switch c.stride {
		case 0:
			c.stride = d
		case d, -1:
		default:
			c.stride = -1
		}
	case d <= 0 && d >= -2*int64(slack):
	default:
		*c = cursor{valid: true, pos: to}
	}
}

// stepAny moves c for an access that stands at any of the positions
// cands (a name seen several times before): the one that continues the
// sequence if any, else one that is tolerated, else a jump to the latest.
func (c *cursor) stepAny(cands []int64, slack int) {
	if len(cands) == 0 {
		return
	}
	if c.valid {
		best := int64(-1)
		for _, q := range cands {
			if d := q - c.pos; d > 0 && d <= int64(slack) && (best < 0 || q < best) {
				best = q
			}
		}
		if best >= 0 {
			c.step(best, slack)
			return
		}
		for _, q := range cands {
			if d := q - c.pos; d <= 0 && d >= -2*int64(slack) {
				return
			}
		}
	}
	*c = cursor{valid: true, pos: cands[len(cands)-1]}
}

// confident reports whether c has continued long enough to predict.
func (c *cursor) confident(minRun int) bool { return c.valid && c.run >= minRun }

// by is the stride predictions take: the run's common stride, else 1.
func (c *cursor) by() int64 {
	if c.stride > 0 {
		return c.stride
	}
	return 1
}

// dirState is what the detector knows of one directory.
type dirState struct {
	dir     string
	list    *listing        // nil: not listed yet, or dropped by Changed
	missing map[string]bool // names absent from list when it was made
	name    cursor          // name order, positions in list
	hist    cursor          // an order seen before, positions in log
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

// observe moves d's cursors for an access of name.
func (r *ReadAhead) observe(d *dirState, name string) {
	l := r.listed(d, name)
	slack := r.slack(len(l.names))
	if i, ok := l.index[name]; ok {
		d.name.step(int64(i), slack)
	}
	if d.log.recent(name, 2*slack) {
		return // a re-open, or readers a little out of step: nothing new
	}
	cands := d.log.occurrences(name)
	if len(cands) == 0 {
		d.hist = cursor{} // never seen here: the order seen before is left
	} else {
		d.hist.stepAny(cands, slack)
	}
	d.log.append(name)
}

// slack is Tuning.Slack for a directory of n files: a sixteenth of them,
// at least 2 (two readers racing swap neighbours). In a small directory a
// wide slack makes chance runs in random order likely (three steps of at
// most 8 among 16 files are).
func (r *ReadAhead) slack(n int) int {
	return max(2, min(r.tune.Slack, n/16))
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

// predict returns up to n files d's reader is expected to open next, best
// first: the order seen before when it is followed, else name order.
func (r *ReadAhead) predict(d *dirState, n int) []guess {
	if n <= 0 || r.seq-d.last > int64(r.tune.Idle) {
		return nil
	}
	files := len(d.listOrEmpty().names)
	if files < MinDirFiles {
		return nil
	}
	run := r.minRun(files)
	hist, byName := d.hist.confident(run), d.name.confident(run)
	if !hist && !byName {
		return nil
	}
	l := r.listed(d, "")
	if hist {
		if g := r.predictHistory(d, l, n); len(g) > 0 {
			return g
		}
	}
	if !byName {
		return nil
	}
	var out []guess
	for i := d.name.pos + d.name.by(); i < int64(len(l.names)) && len(out) < n; i += d.name.by() {
		out = append(out, guess{join(d.dir, l.names[i]), l.sizes[i]})
	}
	return out
}

// predictHistory walks d's log forward from the history cursor, skipping
// names seen twice and names no longer listed.
func (r *ReadAhead) predictHistory(d *dirState, l *listing, n int) []guess {
	var out []guess
	seen := map[string]bool{}
	cur, _ := d.log.at(d.log.n - 1)
	seen[cur] = true
	limit := d.hist.pos + int64(4*n+r.tune.Slack)*d.hist.by()
	for p := d.hist.pos + d.hist.by(); p < d.log.n && p <= limit && len(out) < n; p += d.hist.by() {
		name, ok := d.log.at(p)
		if !ok || seen[name] {
			continue
		}
		seen[name] = true
		if size, ok := l.size(name); ok {
			out = append(out, guess{join(d.dir, name), size})
		}
	}
	return out
}
