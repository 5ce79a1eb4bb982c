package loader

import "testing"

// TestGentleLoadsTakeTwoWorkers: the staging after a plain read shares
// the host link with the reader, which may still be copying its mapping
// to the device. Such loads have at most gentleTasks tasks in flight
// together on a device's loader while nobody has joined them (several
// files closed one after another count together); a demand load gets
// every task it asks for, and a joined one is not capped.
func TestGentleLoadsTakeTwoWorkers(t *testing.T) {
	l := &Loader{opts: Options{TaskSize: 4096}, wake: make(chan struct{}, 1)}
	ts := l.opts.TaskSize
	var gentle []*job
	for _, rel := range []string{"a", "b", "c"} {
		j := &job{rel: rel, size: 10 * ts, bg: &Background{Gentle: true}, l: l, done: make(chan struct{})}
		j.bg.Low.Store(true)
		j.left.Store(10)
		gentle = append(gentle, j)
		l.jobs = append(l.jobs, j)
	}

	var held []*task
	for range 4 {
		if tk := l.take(); tk != nil {
			held = append(held, tk)
		}
	}
	if len(held) != gentleTasks {
		t.Fatalf("three gentle loads got %d tasks at once, want %d in all", len(held), gentleTasks)
	}
	demand := &job{rel: "demand", size: 3 * ts, l: l}
	l.jobs = append(l.jobs, demand)
	for i := range 3 {
		if tk := l.take(); tk == nil || tk.j != demand {
			t.Fatalf("demand task %d not handed out beside capped gentle loads", i)
		}
	}
	if tk := l.take(); tk != nil {
		t.Fatalf("a third gentle task (%s) was handed out", tk.j.rel)
	}
	held[0].end(nil)
	select {
	case <-l.wake:
	default:
		t.Fatal("the end of a gentle task woke no worker")
	}
	next := l.take()
	if next == nil || !next.gentle {
		t.Fatal("no gentle task handed out after one ended")
	}
	if tk := l.take(); tk != nil {
		t.Fatalf("a third gentle task (%s) was handed out", tk.j.rel)
	}
	for _, j := range gentle {
		j.bg.Low.Store(false) // a lease joined them (entry.keepLocked)
	}
	for i := range 3 {
		if tk := l.take(); tk == nil || tk.gentle {
			t.Fatalf("joined loads: task %d not handed out, or counted as gentle", i)
		}
	}
	held[1].end(nil) // handed out while gentle: still counted as such
	next.end(nil)
	l.mu.Lock()
	n := l.gentle
	l.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d gentle tasks counted in flight after all ended", n)
	}
}
