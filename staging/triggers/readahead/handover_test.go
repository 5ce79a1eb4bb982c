package readahead

import (
	"encoding/json"
	"slices"
	"testing"
)

// TestRunnerAdopt: a runner continues from another's State (through
// JSON): its clock moves past the other's ticks, the counters add up, and
// the other's trace comes before its own within the bound.
func TestRunnerAdopt(t *testing.T) {
	a := newRunner(t, Defaults(), NewRecorder(10))
	for _, rel := range seq("d", 0, 1, 2, 3) {
		a.Opened(rel)
	}
	a.Drain()
	st := a.State()
	if st.Clock != 4 || st.Stats.Issued == 0 || !slices.Equal(st.Trace, seq("d", 0, 1, 2, 3)) {
		t.Fatalf("state %+v: want clock 4, read-ahead issued, the trace of d/0..3", st)
	}
	raw, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	var got State
	if err := json.Unmarshal(raw, &got); err != nil {
		t.Fatal(err)
	}
	rec := NewRecorder(4)
	b := newRunner(t, Defaults(), rec)
	b.Opened("x")
	b.Adopt(got)
	if at := b.Opened("y"); at != 5 {
		t.Fatalf("tick %d after adopting clock 4, want 5", at)
	}
	tr := rec.Trace("", "")
	if want := append(seq("d", 2, 3), "x", "y"); !slices.Equal(tr.Paths, want) || tr.Dropped != 2 {
		t.Fatalf("trace %v dropped %d, want %v and 2 dropped", tr.Paths, tr.Dropped, want)
	}
	b.Drain()
	if s := b.Stats(); s.Issued < st.Stats.Issued {
		t.Fatalf("issued %d, want at least the predecessor's %d", s.Issued, st.Stats.Issued)
	}
}
