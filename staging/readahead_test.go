package staging

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/gdsfs/gdsfs/gpu"
	"github.com/gdsfs/gdsfs/internal/units"
	"github.com/gdsfs/gdsfs/staging/triggers/readahead"
)

// raFiles is the size of the read-ahead directory d/ (name order f00..f39);
// raSize the size of each of its files unless a test says otherwise.
const (
	raFiles = 40
	raSize  = 64 << 10
)

func raName(i int) string { return fmt.Sprintf("d/f%02d", i) }

// raNames is raName(from) .. raName(to-1).
func raNames(from, to int) []string {
	var out []string
	for i := from; i < to; i++ {
		out = append(out, raName(i))
	}
	return out
}

// raCache writes d/ (sizes: per index, raSize when absent) and opens a
// cache with read-ahead on (4 files), opens that do not stage
// (prefetch: manual), no racy wait, and the runner left to the test:
// drain carries out what the detector asks for after the events so far.
// edit, when set, changes the configuration first.
func raCache(t *testing.T, sizes map[int]int, edit func(*Config)) *Cache {
	t.Helper()
	src := t.TempDir()
	for i := range raFiles {
		n, ok := sizes[i]
		if !ok {
			n = raSize
		}
		writeFile(t, src, raName(i), randomBytes(n, uint64(i)))
	}
	opts, io := testOptions()
	opts.Prefetch, opts.RacyWindow = PrefetchManual, 0
	opts.ReadAheadFiles, opts.ReadAheadBytes = 4, 8<<30
	cfg := Config{Source: src, Options: opts, IO: io, manualReadAhead: true}
	if edit != nil {
		edit(&cfg)
	}
	return newCacheCfg(t, cfg)
}

// drain feeds the runner's queued events to the detector and carries out
// its plan, as the executor's goroutine does.
func drain(c *Cache) { carry(c, c.ra.Drain()) }

// carry carries out p with c's read-ahead executor (Config.ReadAhead).
func carry(c *Cache, p readahead.Plan) { c.raExec.(*readahead.Executor).Carry(p) }

func entryPaths(c *Cache) []string {
	var out []string
	for _, e := range c.Entries() {
		out = append(out, e.Path)
	}
	return out
}

// TestReadAheadNameOrder: opens in name order stage the next
// files before they are opened, within the window's bound in files and
// bytes; opening them counts hits and moves the window on. The opens are
// held (staging.defer_while_read: the files being read wait for their
// readers), yet the files ahead of the reader are staged at once.
func TestReadAheadNameOrder(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files int
		bytes units.Size
		want  int
	}{
		{"files bound", 4, 8 << 30, 4},
		{"fewer files", 2, 8 << 30, 2},
		{"bytes bound", 8, 3 * raSize, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := raCache(t, nil, func(cfg *Config) {
				o := &cfg.Options
				o.Prefetch, o.DeferWhileRead = PrefetchOpen, true
				o.ReadAheadFiles, o.ReadAheadBytes, o.TraceEntries = tc.files, tc.bytes, 64
			})
			rec := record(t, c)
			for i := range 4 {
				c.Opened(raName(i)) // held open: being read
			}
			drain(c)
			ahead := raNames(4, 4+tc.want)
			for _, rel := range ahead {
				if e := rec.waitFor(t, rel, StateLoading); e.Reason != "read-ahead" {
					t.Fatalf("%s loading for %q, want read-ahead", rel, e.Reason)
				}
				rec.waitFor(t, rel, StateResident)
			}
			drain(c) // the loads' answers: nothing more to ask for
			if got := entryPaths(c); !slices.Equal(got, ahead) {
				t.Fatalf("staged %v, want exactly %v: the files ahead, within the window, not the ones being read", got, ahead)
			}
			if s := c.Stats(); s.Issued != uint64(tc.want) || s.Stats.Hits != 0 || s.DeferredOpens != 4 {
				t.Fatalf("issued %d hits %d deferred %d, want %d, 0, 4", s.Issued, s.Stats.Hits, s.DeferredOpens, tc.want)
			}
			for _, rel := range ahead {
				c.Opened(rel)
			}
			drain(c)
			if s := c.Stats(); s.Stats.Hits != uint64(tc.want) || s.WastedBytes != 0 {
				t.Fatalf("hits %d wasted %d after opening the files read ahead, want %d and 0", s.Stats.Hits, s.WastedBytes, tc.want)
			}
			for _, rel := range raNames(4+tc.want, 4+2*tc.want) {
				rec.waitFor(t, rel, StateResident)
			}
			if got := c.Trace().Trace("", "").Paths; !slices.Equal(got, raNames(0, 4+tc.want)) {
				t.Fatalf("trace %v, want the opens in order", got)
			}
		})
	}
}

// TestReadAheadFedByLeasesAndOpens: the runner's own goroutine plans from
// opens and leases alike (a lease is an access too).
func TestReadAheadFedByLeasesAndOpens(t *testing.T) {
	c := raCache(t, nil, func(cfg *Config) { cfg.manualReadAhead = false })
	rec := record(t, c)
	for i := range 4 {
		if i%2 == 0 {
			c.Opened(raName(i))
			continue
		}
		l, err := c.Acquire(context.Background(), Request{Rel: raName(i)})
		if err != nil {
			t.Fatal(err)
		}
		l.Release()
	}
	for _, rel := range raNames(4, 8) {
		if e := rec.waitFor(t, rel, StateLoading); e.Reason != "read-ahead" {
			t.Fatalf("%s loading for %q, want read-ahead", rel, e.Reason)
		}
		rec.waitFor(t, rel, StateResident)
	}
}

// TestReplayStagesInOrder: a replayed trace is staged in its order, paced
// by the window (with read-ahead off: one file at a time); files it has
// yet to stage read as loading; paths that are not files are skipped.
func TestReplayStagesInOrder(t *testing.T) {
	trace := []string{raName(10), raName(3), "missing/x", raName(25), raName(0), raName(39), raName(7)}
	files := slices.DeleteFunc(slices.Clone(trace), func(s string) bool { return s == "missing/x" })
	for _, tc := range []struct {
		name   string
		window int
	}{{"read-ahead off", 0}, {"window of 2", 2}} {
		t.Run(tc.name, func(t *testing.T) {
			c := raCache(t, nil, func(cfg *Config) {
				cfg.Options.ReadAheadFiles = tc.window
				if tc.window == 0 {
					cfg.Options.ReadAheadBytes = 0
				}
			})
			rec := record(t, c)
			c.Replay(trace)
			for _, rel := range files {
				if st, _ := c.Attr(rel); st != StateLoading {
					t.Fatalf("%s reads %q before the replay staged it, want loading", rel, st)
				}
			}
			per := max(1, tc.window)
			for next := 0; next < len(files); next += per {
				p := c.ra.Drain()
				want := files[next:min(len(files), next+per)]
				if got := itemRels(p.Stage); !slices.Equal(got, want) || len(p.Cancel) > 0 {
					t.Fatalf("plan %+v, want %v asked for next", p, want)
				}
				carry(c, p)
				for _, rel := range want {
					rec.waitFor(t, rel, StateResident)
				}
			}
			drain(c)
			if got := entryPaths(c); !slices.Equal(got, slices.Sorted(slices.Values(files))) {
				t.Fatalf("staged %v, want the trace's files", got)
			}
			if s := c.Stats(); s.ReplaySkipped != 1 || s.ReplayPending != 0 || s.Issued != uint64(len(files)) {
				t.Fatalf("skipped %d pending %d issued %d, want 1, 0, %d", s.ReplaySkipped, s.ReplayPending, s.Issued, len(files))
			}
		})
	}
}

func itemRels(items []readahead.Item) []string {
	var out []string
	for _, it := range items {
		out = append(out, it.Rel)
	}
	return out
}

// TestRandomOrderGivesNoReadAhead: opens in a shuffled order (five epochs
// of one directory, a fixed seed) stage nothing ahead; the same cache then
// reads ahead of a name-order reader. (A chance run in random order can
// predict: staging/triggers/readahead bounds how often, over many seeds.)
func TestRandomOrderGivesNoReadAhead(t *testing.T) {
	c := raCache(t, nil, nil)
	rec := record(t, c)
	r := rand.New(rand.NewPCG(2, 10))
	for range 5 {
		for _, i := range r.Perm(raFiles) {
			c.Opened(raName(i))
			drain(c)
		}
	}
	if s := c.Stats(); s.Issued != 0 || len(c.Entries()) != 0 {
		t.Fatalf("random order: %d files read ahead, %d staged; want none", s.Issued, len(c.Entries()))
	}
	for i := 20; i < 24; i++ {
		c.Opened(raName(i))
	}
	drain(c)
	for _, rel := range raNames(24, 28) {
		rec.waitFor(t, rel, StateResident)
	}
}

// TestReadAheadNeverEvictsLeasedOrHotter: with the capacity full, a
// read-ahead load takes the room of entries used before the access that
// planned it, never a leased one nor one opened after that access; when
// those are not enough it declines (NoRoom) and evicts nothing more.
func TestReadAheadNeverEvictsLeasedOrHotter(t *testing.T) {
	declined := make(chan readahead.Why, 8)
	c := raCache(t, nil, func(cfg *Config) {
		cfg.Options.Capacity = capacityFor(6, raSize)
		cfg.ReadAhead = readahead.NewExecutor(func(_ string, why readahead.Why) { declined <- why })
	})
	src := c.root.Path()
	for _, rel := range []string{"h/a", "h/b", "o/0", "o/1", "o/2", "o/3"} {
		writeFile(t, src, rel, randomBytes(raSize, 99))
	}
	rec := record(t, c)
	for _, rel := range []string{"h/a", "h/b"} {
		l, err := c.Acquire(context.Background(), Request{Rel: rel})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Release()
	}
	for _, rel := range []string{"o/0", "o/1", "o/2", "o/3"} {
		if _, err := c.Stage(context.Background(), rel); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 4 {
		c.Opened(raName(i)) // plans d/f04..f07
	}
	c.Opened("o/2") // used after the access that planned them: hotter
	drain(c)
	if why := recv(t, declined, "read-ahead declined"); why != readahead.NoRoom {
		t.Fatalf("declined for %d, want NoRoom", why)
	}
	for _, rel := range []string{"o/0", "o/1", "o/3"} {
		if e := rec.waitFor(t, rel, StateAbsent); e.Reason != "evicted" {
			t.Fatalf("%s absent for %q", rel, e.Reason)
		}
	}
	var loaded []string
	rec.waitUntil(t, func(all []Event) bool {
		loaded = nil
		for _, e := range all {
			if e.State == StateResident && slices.Contains(raNames(4, 8), e.Rel) {
				loaded = append(loaded, e.Rel)
			}
		}
		return len(loaded) >= 3
	})
	for _, rel := range []string{"h/a", "h/b", "o/2"} {
		if st, _ := c.Attr(rel); st != StateResident {
			t.Fatalf("%s is %s: read-ahead evicted a leased or hotter entry", rel, st)
		}
	}
	drain(c)
	if s := c.Stats(); s.Declined != 1 || s.Evictions != 3 {
		t.Fatalf("declined %d evictions %d, want 1 and 3", s.Declined, s.Evictions)
	}
}

// blockingCache is raCache on a device whose copies wait for release to
// be closed, with workers loader workers (0: testOptions') and files
// read ahead at once.
func blockingCache(t *testing.T, sizes map[int]int, workers, files int) (*Cache, *fakeDevice, chan struct{}) {
	d := newFake(1 << 20)
	release := make(chan struct{})
	d.copyHook = func() error { <-release; return nil }
	c := raCache(t, sizes, func(cfg *Config) {
		cfg.Devices = []gpu.Device{d}
		cfg.Options.ReadAheadFiles = files
		if workers > 0 {
			cfg.IO.NumThreads = units.AutoCount(workers)
		}
	})
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	return c, d, release
}
