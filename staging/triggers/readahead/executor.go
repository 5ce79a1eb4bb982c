package readahead

import (
	"context"
	"slices"

	"github.com/gdsfs/gdsfs/staging/triggers"
)

// Executor carries out the Runner's Plans through the cache's API for
// triggers (triggers.Core): each file asked for is loaded at background
// priority, each cancelled one stops. A read-ahead load:
//
//   - never blocks the open path: plans are carried out on the runner's
//     goroutine, each load started on a goroutine of its own;
//   - never waits for room, and takes none while a demand waits for it;
//     it takes free room or the room of entries MayEvict allows (never a
//     leased or pinned entry, never one used since the access that
//     planned it, never one of the window);
//   - yields the loader's workers to demand loads, and stops when its
//     file falls out of the window before it loaded;
//   - is promoted by the first demand that meets it (an open, a lease, a
//     prefetch): demand priority, never cancelled from then on;
//   - is not held back by staging.defer_while_read: the files it asks
//     for are ahead of the reader, not being read (a file open through
//     the mount is left to its readers' last close).
//
// The runner is told of a read-ahead entry's changes (Started, Loaded,
// Declined, Evicted) by the cache's Observe call, under the cache's lock
// and before subscribers get the event, so whoever waits for an event
// finds the runner already told.
//
// It has no lock of its own: it is fixed once Attach returns, and the
// runner's lock (Runner.mu) is a leaf.
type Executor struct {
	declined func(rel string, why Why)
	core     triggers.Core
	runner   *Runner
}

// NewExecutor makes an executor; declined, when set, hears every request
// the cache did not take, after the runner (tests).
func NewExecutor(declined func(rel string, why Why)) *Executor {
	return &Executor{declined: declined}
}

// Attach gives the executor the cache and the runner whose Plans it
// carries out. The cache calls it once, before anything is planned.
func (x *Executor) Attach(core triggers.Core, runner *Runner) {
	x.core, x.runner = core, runner
}

// Run carries out the runner's Plans as they come, until ctx is done.
func (x *Executor) Run(ctx context.Context) { x.runner.Run(ctx, x.Carry) }

// Carry carries out a Plan. It never blocks: each load starts on a
// goroutine of its own (the window bounds them). A cancelled load leaves
// the cache at once (its absent event says "read-ahead cancelled").
func (x *Executor) Carry(p Plan) {
	for _, rel := range p.Cancel {
		x.core.CancelBackground(rel, "read-ahead cancelled")
	}
	for _, it := range p.Stage {
		if !x.core.Go(func() { x.load(it) }) {
			x.decline(it.Rel, NotStaged)
		}
	}
}

// load asks the cache to load it.Rel at background priority; what it
// does not take is Declined.
func (x *Executor) load(it Item) {
	var window []Item
	o := x.core.StartBackground(triggers.Background{
		Rel: it.Rel, LastUse: it.Heat, Reason: "read-ahead",
		Admit: func() bool {
			// Cancelled, or used, before its load began: not in the window.
			window = x.runner.Window()
			return slices.ContainsFunc(window, func(w Item) bool { return w.Rel == it.Rel })
		},
		MayEvict: func(v triggers.Victim) bool {
			return MayEvict(Use{Rel: v.Rel, LastUse: v.LastUse, Leased: v.Leased}, window)
		},
		Observe: x.observe,
	})
	if o != triggers.Started {
		x.decline(it.Rel, whyOf(o))
	}
}

// observe tells the runner what became of a read-ahead load; the cache
// calls it under its lock.
func (x *Executor) observe(rel string, o triggers.Outcome) {
	switch o {
	case triggers.Started:
		x.runner.Started(rel) // with the entry: an access racing with it finds it loading, a hit
	case triggers.Loaded:
		x.runner.Loaded(rel)
	case triggers.Left:
		x.runner.Evicted(rel) // loaded ahead and never used: wasted
	case triggers.Staged, triggers.NoRoom, triggers.NotStaged:
		x.decline(rel, whyOf(o))
	}
}

// decline answers a read-ahead request the cache did not take.
func (x *Executor) decline(rel string, why Why) {
	x.runner.Declined(rel, why)
	if x.declined != nil {
		x.declined(rel, why)
	}
}

// whyOf is why the cache did not take a request, as the planner counts it.
func whyOf(o triggers.Outcome) Why {
	switch o {
	case triggers.Staged:
		return Staged
	case triggers.NoRoom:
		return NoRoom
	}
	return NotStaged
}
