package readahead

// State is what a runner hands to its successor in another daemon: the
// clock (the cache stamps its entries' last uses with its ticks), the
// counters and the access trace. encoding/json round-trips it.
type State struct {
	Clock        uint64   `json:"clock"`
	Stats        Stats    `json:"stats"`
	Trace        []string `json:"trace,omitempty"` // oldest first
	TraceDropped uint64   `json:"trace_dropped,omitempty"`
}

// State returns the runner's clock, counters and trace now.
func (r *Runner) State() State {
	st := State{Clock: r.clock.Load(), Stats: r.ra.Stats()}
	if r.trace != nil {
		t := r.trace.Trace("", "")
		st.Trace, st.TraceDropped = t.Paths, t.Dropped
	}
	return st
}

// Adopt continues from a predecessor's State: the clock moves on to its
// ticks (never back), its counters are added to these (replay_pending,
// a count of work left, is not), its trace goes before what this runner
// recorded (the oldest beyond the bound dropped), and the detector learns
// its order (Learn) on the runner's goroutine.
func (r *Runner) Adopt(st State) {
	for {
		cur := r.clock.Load()
		if cur >= st.Clock || r.clock.CompareAndSwap(cur, st.Clock) {
			break
		}
	}
	c := &r.ra.stats
	c.issued.Add(st.Stats.Issued)
	c.hits.Add(st.Stats.Hits)
	c.wastedBytes.Add(st.Stats.WastedBytes)
	c.cancelled.Add(st.Stats.Cancelled)
	c.declined.Add(st.Stats.Declined)
	c.dropped.Add(st.Stats.Dropped)
	c.replaySkipped.Add(st.Stats.ReplaySkipped)
	r.trace.prepend(st.Trace, st.TraceDropped)
	if len(st.Trace) > 0 {
		r.push(event{kind: evLearn, rels: st.Trace})
	}
}

// prepend puts paths (oldest first) before what t recorded, keeping the
// newest entries within its bound; dropped entries count as dropped.
func (t *Recorder) prepend(paths []string, dropped uint64) {
	if t == nil || len(paths) == 0 && dropped == 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	cur := append(append([]string(nil), t.ring[t.next:]...), t.ring[:t.next]...)
	all := append(append(make([]string, 0, len(paths)+len(cur)), paths...), cur...)
	if over := len(all) - t.max; over > 0 {
		all = all[over:]
		dropped += uint64(over)
	}
	if len(cur) == 0 && len(all) > 0 {
		t.last = all[len(all)-1]
	}
	t.ring, t.next = all, 0
	t.dropped += dropped
}
