package readahead

import (
	"context"
	"slices"
	"testing"
)

func newRunner(t *testing.T, opts Options, rec *Recorder) *Runner {
	files := map[string][]Entry{"d": shards(50, 1)}
	return NewRunner(New(Config{Options: opts, List: func(dir string) ([]Entry, error) { return files[dir], nil }}), rec)
}

func TestRunnerDrainMergesPlans(t *testing.T) {
	r := newRunner(t, Defaults(), nil)
	var ticks []uint64
	for _, rel := range seq("d", 0, 1, 2, 3, 30) { // planned, then cancelled by the jump
		ticks = append(ticks, r.Opened(rel))
	}
	if !slices.Equal(ticks, []uint64{1, 2, 3, 4, 5}) {
		t.Fatalf("ticks %v, want 1..5", ticks)
	}
	if p := r.Drain(); !p.Empty() {
		t.Fatalf("plan %+v, want nothing: what was asked for and cancelled in one drain is neither", p)
	}
	r.Leased(name("d", 31))
	r.Leased(name("d", 32))
	r.Opened(name("d", 33))
	p := r.Drain()
	if got := rels(p.Stage); !slices.Equal(got, seq("d", 34, 35, 36, 37)) || len(p.Cancel) != 0 {
		t.Fatalf("plan %+v, want d/34..37 asked for", p)
	}
	r.Started(name("d", 34))
	for _, i := range []int{10, 11, 12, 33, 34, 35, 36} {
		r.Opened(name("d", i)) // a jump cancels 34..37; 33.. then asks for 37..40
	}
	p = r.Drain()
	if got := rels(p.Stage); !slices.Equal(got, seq("d", 38, 39, 40)) || !slices.Equal(p.Cancel, seq("d", 34, 35, 36)) {
		t.Fatalf("plan %+v: want 38..40 asked for, 34..36 cancelled, 37 neither (its load goes on)", p)
	}
}

func TestRunnerDropsAccessesBeyondItsQueue(t *testing.T) {
	rec := NewRecorder(QueueLimit + 10)
	r := newRunner(t, Defaults(), rec)
	for i := range QueueLimit + 3 {
		r.Opened(name("d", i%50))
	}
	r.Loaded("d/x") // answers are never dropped
	if s := r.Stats(); s.Dropped != 3 {
		t.Fatalf("dropped %d, want 3", s.Dropped)
	}
	if n := len(rec.Trace("", "").Paths); n != QueueLimit+3 {
		t.Fatalf("trace holds %d entries, want %d: the trace records what the detector drops", n, QueueLimit+3)
	}
	r.mu.Lock()
	n := len(r.queue)
	r.mu.Unlock()
	if n != QueueLimit+1 {
		t.Fatalf("queue holds %d events, want %d", n, QueueLimit+1)
	}
}

func TestRunnerRun(t *testing.T) {
	r := newRunner(t, Defaults(), nil)
	ctx, cancel := context.WithCancel(context.Background())
	plans := make(chan Plan)
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.Run(ctx, func(p Plan) { plans <- p })
	}()
	for _, rel := range seq("d", 0, 1, 2, 3) {
		r.Opened(rel)
	}
	var staged []string
	for len(staged) < 4 {
		staged = append(staged, rels((<-plans).Stage)...)
	}
	if !slices.Equal(staged, seq("d", 4, 5, 6, 7)) {
		t.Fatalf("staged %q, want d/4..7", staged)
	}
	cancel()
	<-done
}

func rels(items []Item) []string {
	var out []string
	for _, it := range items {
		out = append(out, it.Rel)
	}
	return out
}
