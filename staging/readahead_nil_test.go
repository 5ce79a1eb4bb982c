package staging

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gdsfs/gdsfs/staging/triggers/readahead"
)

// TestPlannerRunsWithoutAnExecutor: with Config.ReadAhead nil (as
// tools/bench makes its caches) the cache still runs the read-ahead
// planner: the runner's queue is drained into it, so more accesses than
// readahead.QueueLimit are seen and none is dropped while it keeps up,
// and a replay is taken in rather than left to pile up; its plans are
// carried out by nobody (nothing is staged). Each directory's opens in
// name order make a plan the test hears (unexecuted): the planner has
// seen everything pushed before them, the accesses of f in between too.
func TestPlannerRunsWithoutAnExecutor(t *testing.T) {
	src := t.TempDir()
	dirs := []string{"a", "b", "c"}
	for _, d := range dirs {
		for i := range 40 { // enough to tell an order (readahead.MinDirFiles, Tuning.MinRun)
			writeFile(t, src, fmt.Sprintf("%s/%02d", d, i), randomBytes(4096, uint64(i)))
		}
	}
	writeFile(t, src, "f", randomBytes(4096, 9))
	opts, io := testOptions()
	opts.Prefetch = PrefetchManual
	opts.ReadAheadFiles, opts.ReadAheadBytes = 4, 8<<30
	c := newPlainCache(t, src, opts, io)
	plans := make(chan readahead.Plan, 64)
	c.hooks.unexecuted = func(p readahead.Plan) {
		select {
		case plans <- p:
		default: // never blocks the runner; the test reads them as they come
		}
	}
	c.Replay([]string{"gone"}) // not in SOURCE: skipped once the planner sees it
	accesses := 0
	for k, d := range dirs {
		if k > 0 {
			for range readahead.QueueLimit / 2 {
				c.Opened("f")
			}
			accesses += readahead.QueueLimit / 2
		}
		for i := range 4 {
			c.Opened(fmt.Sprintf("%s/%02d", d, i))
		}
		accesses += 4
		waitPlanIn(t, plans, d)
	}
	s := c.Stats()
	if s.Dropped != 0 {
		t.Errorf("readahead_dropped %d after %d accesses the planner kept up with, want 0", s.Dropped, accesses)
	}
	if s.ReplaySkipped != 1 {
		t.Errorf("replay_skipped %d, want 1: the replay of a file not in SOURCE was not taken in", s.ReplaySkipped)
	}
	if state, _ := c.Attr("gone"); state != StateAbsent {
		t.Errorf("gone, skipped by the replay, reads %s, want %s", state, StateAbsent)
	}
	if n := len(c.Entries()); n != 0 {
		t.Errorf("%d entries: with no executor no plan is carried out", n)
	}
	if accesses <= readahead.QueueLimit {
		t.Fatalf("only %d accesses: not more than the queue holds", accesses)
	}
}

// waitPlanIn waits for a plan that asks for a file of directory dir.
// The deadline only turns a hang into a failure.
func waitPlanIn(t *testing.T, plans <-chan readahead.Plan, dir string) {
	t.Helper()
	timeout := time.After(20 * time.Second)
	for {
		select {
		case p := <-plans:
			for _, it := range p.Stage {
				if strings.HasPrefix(it.Rel, dir+"/") {
					return
				}
			}
		case <-timeout:
			t.Fatalf("no plan asked for a file of %s after its opens in name order: the planner is not fed", dir)
		}
	}
}
