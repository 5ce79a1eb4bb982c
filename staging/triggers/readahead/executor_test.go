package readahead

import (
	"cmp"
	"slices"
	"sync"
	"testing"

	"github.com/gdsfs/gdsfs/staging/triggers"
)

// fakeCore plays the cache's API for background loads: StartBackground
// asks the request's hooks as the cache does (Admit, then MayEvict of
// each of victims) and answers what answer says for its path (Started
// when absent, telling Observe first).
type fakeCore struct {
	mu        sync.Mutex
	answer    map[string]triggers.Outcome
	victims   []triggers.Victim
	started   []triggers.Background
	evictable map[string][]string // per request: the victims MayEvict allowed
	cancelled []string
	closed    bool
	wg        sync.WaitGroup
}

func (f *fakeCore) StartBackground(b triggers.Background) triggers.Outcome {
	f.mu.Lock()
	defer f.mu.Unlock()
	if b.Admit != nil && !b.Admit() {
		return triggers.NotStaged
	}
	for _, v := range f.victims {
		if b.MayEvict(v) {
			f.evictable[b.Rel] = append(f.evictable[b.Rel], v.Rel)
		}
	}
	o, ok := f.answer[b.Rel]
	if !ok {
		o = triggers.Started
		f.started = append(f.started, b)
		b.Observe(b.Rel, triggers.Started)
	}
	return o
}

func (f *fakeCore) CancelBackground(rel, reason string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if reason != "read-ahead cancelled" {
		panic("cancelled for " + reason)
	}
	f.cancelled = append(f.cancelled, rel)
}

func (f *fakeCore) Go(fn func()) bool {
	if f.closed {
		return false
	}
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		fn()
	}()
	return true
}

// TestExecutorCarriesOutPlans: the executor asks the cache for each file
// of a plan at background priority (reason "read-ahead", the item's heat
// as its last use), only while the file is in the window, with MayEvict
// as its victim-choice hook; it cancels what the plan cancels; and the
// runner hears what the cache answered or observed (declined for each
// file not started, all of them once the cache is closed).
func TestExecutorCarriesOutPlans(t *testing.T) {
	r := newRunner(t, Defaults(), nil)
	var mu sync.Mutex
	declined := map[string]Why{}
	x := NewExecutor(func(rel string, why Why) {
		mu.Lock()
		declined[rel] = why
		mu.Unlock()
	})
	core := &fakeCore{
		answer:    map[string]triggers.Outcome{name("d", 5): triggers.NoRoom, name("d", 6): triggers.Staged},
		victims:   []triggers.Victim{{Rel: "old", LastUse: 0}, {Rel: "leased", Leased: true}, {Rel: name("d", 7)}},
		evictable: map[string][]string{},
	}
	x.Attach(core, r)
	for _, rel := range seq("d", 0, 1, 2, 3) {
		r.Opened(rel)
	}
	p := r.Drain()
	if got := rels(p.Stage); !slices.Equal(got, seq("d", 4, 5, 6, 7)) {
		t.Fatalf("plan %+v, want d/4..7 asked for", p)
	}
	x.Carry(Plan{Stage: p.Stage, Cancel: []string{"d/gone"}})
	core.wg.Wait()
	if len(core.started) != 2 {
		t.Fatalf("started %d loads, want 2 (d/4, d/7)", len(core.started))
	}
	slices.SortFunc(core.started, func(a, b triggers.Background) int { return cmp.Compare(a.Rel, b.Rel) })
	for _, b := range core.started {
		if b.Reason != "read-ahead" || b.LastUse != 4 {
			t.Fatalf("%s asked for with reason %q, last use %d; want read-ahead and the heat 4", b.Rel, b.Reason, b.LastUse)
		}
	}
	for rel, v := range core.evictable {
		if !slices.Equal(v, []string{"old"}) {
			t.Fatalf("%s may evict %v, want only the cold, unleased entry outside the window", rel, v)
		}
	}
	if !slices.Equal(core.cancelled, []string{"d/gone"}) {
		t.Fatalf("cancelled %v", core.cancelled)
	}
	if declined[name("d", 5)] != NoRoom || declined[name("d", 6)] != Staged || len(declined) != 2 {
		t.Fatalf("declined %v, want d/5 no room and d/6 staged", declined)
	}
	r.Drain()
	if s := r.Stats(); s.Declined != 2 || s.Issued != 4 {
		t.Fatalf("declined %d issued %d, want 2 and 4", s.Declined, s.Issued)
	}

	// Outside the window (a file used before its load began): not staged.
	x.Carry(Plan{Stage: []Item{{Rel: "d/elsewhere"}}})
	core.wg.Wait()
	if declined["d/elsewhere"] != NotStaged {
		t.Fatalf("a file outside the window: declined %v", declined)
	}

	// What the cache observes reaches the runner: a file loaded ahead
	// that leaves unused is wasted.
	core.mu.Lock()
	for _, b := range core.started {
		b.Observe(b.Rel, triggers.Loaded)
	}
	core.started[0].Observe(core.started[0].Rel, triggers.Left)
	core.mu.Unlock()
	r.Drain()
	if s := r.Stats(); s.WastedBytes != 1 {
		t.Fatalf("wasted %d bytes, want 1: the one file that left unused", s.WastedBytes)
	}

	core.closed = true
	x.Carry(Plan{Stage: []Item{{Rel: name("d", 9)}}})
	if declined[name("d", 9)] != NotStaged {
		t.Fatalf("closed cache: declined %v, want d/9 not staged", declined)
	}
}
