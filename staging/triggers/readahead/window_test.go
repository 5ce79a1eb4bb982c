package readahead

import (
	"math/rand/v2"
	"slices"
	"testing"
)

func TestWindowBound(t *testing.T) {
	const MiB = 1 << 20
	for _, tc := range []struct {
		name   string
		files  int
		bytes  int64
		sizes  map[int]int64 // size of f-i; others 1MiB
		window []int
	}{
		{"files bound", 2, 1 << 30, nil, []int{4, 5}},
		{"bytes bound", 4, 3 * MiB, nil, []int{4, 5, 6}},
		{"a file larger than the bytes bound is never read ahead", 4, 3 * MiB, map[int]int64{4: 4 * MiB}, nil},
		{"the window stops at the first file that does not fit", 4, 10 * MiB, map[int]int64{6: 9 * MiB}, []int{4, 5}},
		{"default", 4, 8 << 30, nil, []int{4, 5, 6, 7}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			files := shards(40, MiB)
			for i, s := range tc.sizes {
				files[i].Size = s
			}
			c := newFake(t, Options{Files: tc.files, Bytes: unitsSize(tc.bytes)}, Tuning{}, map[string][]Entry{"d": files})
			c.open(seq("d", 0, 1, 2, 3)...)
			if got, want := c.window(), seq("d", tc.window...); !slices.Equal(got, want) {
				t.Fatalf("window %q, want %q", got, want)
			}
		})
	}
}

func TestWindowSlidesWithTheReader(t *testing.T) {
	c := newFake(t, Defaults(), Tuning{}, map[string][]Entry{"d": shards(40, 1)})
	c.auto = true
	c.open(seq("d", span(0, 20)...)...)
	if got, want := c.window(), seq("d", 20, 21, 22, 23); !slices.Equal(got, want) {
		t.Fatalf("window %q, want %q", got, want)
	}
	if want := seq("d", span(4, 24)...); !slices.Equal(c.staged, want) || len(c.cancels) != 0 {
		t.Fatalf("asked for %q, cancelled %q: want each of %q once, nothing cancelled", c.staged, c.cancels, want)
	}
	if s := c.ra.Stats(); s.Hits != 16 || s.Issued != 20 {
		t.Fatalf("stats %+v: want 20 issued, 16 hits", s)
	}
}

// answer is how the cache answered the window's requests before the jump.
type answer int

const (
	unanswered answer = iota
	started
	loadedUnused
)

func TestCancelWhenTheReaderJumps(t *testing.T) {
	for _, tc := range []struct {
		name               string
		answer             answer
		cancels            []string
		cancelled, wasted  uint64
		wastedAfterEvicted uint64
	}{
		{"requests not started yet", unanswered, seq("d", 4, 5, 6, 7), 4, 0, 0},
		{"loads in flight", started, seq("d", 4, 5, 6, 7), 4, 4 * 100, 4 * 100},
		{"files loaded stay, and count as wasted once evicted unused", loadedUnused, nil, 0, 0, 4 * 100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newFake(t, Defaults(), Tuning{}, map[string][]Entry{"d": shards(90, 100)})
			c.open(seq("d", 0, 1, 2, 3)...)
			for _, rel := range seq("d", 4, 5, 6, 7) {
				switch tc.answer {
				case started:
					c.ra.Started(rel)
				case loadedUnused:
					c.ra.Started(rel)
					c.apply(c.ra.Loaded(rel, c.tick()))
				}
			}
			c.open(name("d", 60)) // the reader jumps
			s := c.ra.Stats()
			if !slices.Equal(c.cancels, tc.cancels) || s.Cancelled != tc.cancelled || s.WastedBytes != tc.wasted {
				t.Fatalf("cancels %q, stats %+v: want cancels %q, %d cancelled, %d wasted bytes",
					c.cancels, s, tc.cancels, tc.cancelled, tc.wasted)
			}
			if len(c.window()) != 0 {
				t.Fatalf("window %q after the jump, want empty", c.window())
			}
			for _, rel := range seq("d", 4, 5, 6, 7) {
				c.apply(c.ra.Evicted(rel, c.tick()))
			}
			if s := c.ra.Stats(); s.WastedBytes != tc.wastedAfterEvicted {
				t.Fatalf("wasted %d bytes after eviction, want %d", s.WastedBytes, tc.wastedAfterEvicted)
			}
		})
	}
}

func TestCounters(t *testing.T) {
	c := newFake(t, Defaults(), Tuning{}, map[string][]Entry{"d": shards(90, 100)})
	c.open(seq("d", 0, 1, 2, 3)...) // asks for 4 5 6 7
	c.load(name("d", 4))
	c.ra.Started(name("d", 5))
	c.decline(name("d", 6), Staged)
	c.open(name("d", 4)) // hit (resident); asks for 8
	c.open(name("d", 5)) // hit (loading); asks for 9
	c.load(name("d", 8))
	c.open(name("d", 70)) // jump: 6 declined (forgotten), 7 and 9 cancelled, 8 stays resident
	c.apply(c.ra.Evicted(name("d", 8), c.tick()))
	c.apply(c.ra.Evicted(name("d", 4), c.tick())) // used: not wasted
	want := Stats{Issued: 6, Hits: 2, Cancelled: 2, WastedBytes: 100, Declined: 1}
	if s := c.ra.Stats(); s != want {
		t.Fatalf("stats %+v, want %+v", s, want)
	}
	if !slices.Equal(c.cancels, seq("d", 7, 9)) {
		t.Fatalf("cancels %q, want d/f-0007 d/f-0009", c.cancels)
	}
}

func TestDeclinedIsNotAskedForAgainWhileInTheWindow(t *testing.T) {
	c := newFake(t, Defaults(), Tuning{}, map[string][]Entry{"d": shards(90, 100)})
	c.open(seq("d", 0, 1, 2, 3)...)
	c.decline(name("d", 6), NoRoom)
	c.load(name("d", 5))
	c.apply(c.ra.Evicted(name("d", 5), c.tick())) // evicted unused while in the window
	c.open(name("d", 4))
	if want := seq("d", 4, 5, 6, 7, 8); !slices.Equal(c.staged, want) {
		t.Fatalf("asked for %q, want %q (6 and 5 not again)", c.staged, want)
	}
	if got, want := c.window(), seq("d", 7, 8); !slices.Equal(got, want) {
		t.Fatalf("window for MayEvict %q, want %q (declined files are not in it)", got, want)
	}
}

func TestReplayPacedByTheWindow(t *testing.T) {
	files := shards(10, 100)
	files[7].Size = 1000 // larger than the bytes bound: skipped
	c := newFake(t, Options{Files: 2, Bytes: 500}, Tuning{}, map[string][]Entry{"d": files})
	trace := seq("d", 3, 1, 4, 0, 5, 9, 2, 6, 7, 8)
	trace = append(trace, "d/missing")
	c.apply(c.ra.Replay(trace, c.tick()))
	if !slices.Equal(c.staged, trace[:2]) {
		t.Fatalf("asked for %q, want the first two of the trace", c.staged)
	}
	c.open(name("d", 4)) // the reader gets to 4 first: not staged, no hit
	for len(c.inflight) > 0 {
		for _, rel := range c.staged {
			if c.inflight[rel] {
				c.load(rel)
				break
			}
		}
	}
	want := seq("d", 3, 1, 0, 5, 9, 2, 6, 8)
	if !slices.Equal(c.staged, want) {
		t.Fatalf("asked for %q, want %q", c.staged, want)
	}
	if s := c.ra.Stats(); s.ReplaySkipped != 2 || s.ReplayPending != 0 || s.Hits != 0 {
		t.Fatalf("stats %+v: want 2 skipped (too large, missing), none pending, no hit", s)
	}
	c.open(name("d", 3))
	if s := c.ra.Stats(); s.Hits != 1 {
		t.Fatalf("stats %+v: want a hit for a replayed file opened", s)
	}
}

// TestReplayWanted: a replayed file is Wanted from the moment the runner
// is given it until it is staged, declined, skipped or accessed (the cache
// shows it as loading meanwhile).
func TestReplayWanted(t *testing.T) {
	r := newRunner(t, Options{Files: 2, Bytes: 1 << 30}, nil)
	trace := seq("d", 5, 6, 7, 8)
	r.Replay(append(trace, "d/missing"))
	for _, rel := range append(trace, "d/missing") {
		if !r.Wanted(rel) {
			t.Fatalf("%s not Wanted before the detector saw the replay", rel)
		}
	}
	p := r.Drain()
	if got := rels(p.Stage); !slices.Equal(got, seq("d", 5, 6)) {
		t.Fatalf("asked for %v, want d/5, d/6", got)
	}
	r.Started(name("d", 5))
	r.Loaded(name("d", 5))
	r.Declined(name("d", 6), NotStaged)
	r.Opened(name("d", 7)) // the reader got there first
	r.Drain()
	for rel, want := range map[string]bool{name("d", 5): false, name("d", 6): false, name("d", 7): false,
		name("d", 8): true, "d/missing": false} {
		if r.Wanted(rel) != want {
			t.Fatalf("%s: Wanted %v, want %v", rel, !want, want)
		}
	}
	r.Declined(name("d", 8), NoRoom) // the replay stops
	r.Drain()
	if r.Wanted(name("d", 8)) {
		t.Fatal("d/8 still Wanted after the replay stopped")
	}
}

func TestReplayStopsWhenTheCacheHasNoRoom(t *testing.T) {
	c := newFake(t, Options{Files: 2, Bytes: 1 << 30}, Tuning{}, map[string][]Entry{"d": shards(10, 100)})
	c.apply(c.ra.Replay(seq("d", span(0, 10)...), c.tick()))
	c.load(name("d", 0))
	c.decline(name("d", 1), NoRoom)
	c.load(name("d", 2))
	if want := seq("d", 0, 1, 2); !slices.Equal(c.staged, want) || len(c.inflight) != 0 {
		t.Fatalf("asked for %q (in flight %v), want %q and nothing more", c.staged, c.inflight, want)
	}
	if s := c.ra.Stats(); s.ReplayPending != 0 {
		t.Fatalf("stats %+v: want nothing pending", s)
	}
}

func TestReplayWithReadAheadOffGoesOneAtATime(t *testing.T) {
	c := newFake(t, Options{}, Tuning{}, map[string][]Entry{"d": shards(10, 100)})
	c.apply(c.ra.Replay(seq("d", 5, 6, 7), c.tick()))
	if !slices.Equal(c.staged, seq("d", 5)) {
		t.Fatalf("asked for %q, want d/f-0005 alone", c.staged)
	}
	c.auto = true
	c.load(name("d", 5))
	c.open(seq("d", 0, 1, 2, 3, 4)...) // read-ahead off: nothing predicted
	if want := seq("d", 5, 6, 7); !slices.Equal(c.staged, want) {
		t.Fatalf("asked for %q, want %q", c.staged, want)
	}
}

func TestReplayTeachesTheOrder(t *testing.T) {
	c := newFake(t, Options{Files: 2, Bytes: 1 << 30}, Tuning{}, map[string][]Entry{"d": shards(40, 100)})
	trace := seq("d", 30, 2, 17, 5, 11, 23, 8, 36, 1, 14)
	c.apply(c.ra.Replay(trace, c.tick()))
	c.decline(trace[0], NoRoom) // no room at all: the replay stops
	c.open(trace[:4]...)
	if got, want := c.window(), sorted(trace[4:6]); !slices.Equal(got, want) {
		t.Fatalf("window %q, want the trace's next two %q", got, want)
	}
}

// A directory whose readers spread wider than its share takes the files
// beyond its share without taking the replay's: with readahead_files 4,
// a directory and a replay, the replay keeps 2 files in flight while 8
// workers' window holds more than 4.
func TestReplayKeepsItsShareBesideAWideWindow(t *testing.T) {
	c := newFake(t, Defaults(), Tuning{}, map[string][]Entry{"d": shards(1000, 1), "r": shards(100, 1)})
	order := dataLoaderAccesses(1000, 8, 1, 2, 4, rand.New(rand.NewPCG(1, 1000)))
	c.open(seq("d", order[:200]...)...)
	c.apply(c.ra.Replay(seq("r", span(0, 100)...), c.tick()))
	for _, i := range order[200:300] {
		c.open(name("d", i))
		c.ra.mu.Lock()
		flight, window := len(c.ra.replay.flight), len(c.ra.dirs["d"].window)
		c.ra.mu.Unlock()
		if flight != 2 || window <= 4 {
			t.Fatalf("after d/%d: %d replayed files in flight, %d in d's window: want 2, and more than 4", i, flight, window)
		}
	}
}

// A directory whose readers spread over MaxFiles files takes no other
// directory's share: with readahead_files 4, a lone reader's directory
// predicting beside one read by 256 workers keeps its 2 files whichever
// was accessed last.
func TestWideWindowLeavesOthersTheirShare(t *testing.T) {
	c := newFake(t, Defaults(), Tuning{}, map[string][]Entry{"d": shards(4096, 1), "v": shards(100, 1)})
	order := dataLoaderAccesses(4096, MaxFiles, 1, 2, 4, rand.New(rand.NewPCG(1, 4096)))
	c.open(seq("d", order[:2000]...)...)
	c.open(seq("v", 0, 1, 2, 3)...)
	for i := 4; i < 40; i++ {
		c.open(name("v", i))
		c.open(name("d", order[2000+i]))
		c.ra.mu.Lock()
		dw, vw := len(c.ra.dirs["d"].window), len(c.ra.dirs["v"].window)
		c.ra.mu.Unlock()
		if vw < 2 || dw <= 4 {
			t.Fatalf("after v/%d and d's next: v's window holds %d files, d's %d: want at least 2 (v's share), and more than 4", i, vw, dw)
		}
	}
}
