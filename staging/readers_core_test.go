package staging

// The staging after reads against the cache's API for it, through a core
// that wraps the cache (lastCloseCore): where AfterRead.Closed asks the
// cache, a concurrent step can be put in between on the closing
// goroutine, with no sleeps; and what it queues and runs is seen.

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/gdsfs/gdsfs/gpu"
	"github.com/gdsfs/gdsfs/staging/triggers"
	"github.com/gdsfs/gdsfs/staging/triggers/readahead"
)

// lastCloseCore is the cache as the staging after reads sees it. While a
// step is armed, it runs once, right after the first Staged answers (no
// lock held); Go tells ended when a goroutine it ran returns; each
// StageAfterRead is counted.
type lastCloseCore struct {
	*Cache
	step   atomic.Pointer[func()]
	ended  chan struct{}
	queued atomic.Int32
}

func (g *lastCloseCore) Staged(rel string) bool {
	s := g.Cache.Staged(rel)
	if f := g.step.Swap(nil); f != nil {
		(*f)()
	}
	return s
}

func (g *lastCloseCore) StageAfterRead(rel string) bool {
	g.queued.Add(1)
	return g.Cache.StageAfterRead(rel)
}

func (g *lastCloseCore) Go(f func()) bool {
	return g.Cache.Go(func() {
		defer func() {
			select {
			case g.ended <- struct{}{}:
			default:
			}
		}()
		f()
	})
}

// arm puts step right after the next Staged answers.
func (g *lastCloseCore) arm(step func()) { g.step.Store(&step) }

// disarm takes the step back if it did not run, and returns it.
func (g *lastCloseCore) disarm() func() {
	if f := g.step.Swap(nil); f != nil {
		return *f
	}
	return nil
}

// lastCloseCache is a cache over "f" made with ctx whose staging after
// reads goes through a lastCloseCore. Its page cache checks are reported
// on checked (the file is never wholly cached: a settling wait waits),
// its settling waits never tick, and it has no staging.defer_limit.
func lastCloseCache(t *testing.T, ctx context.Context) (c *Cache, core *lastCloseCore, rec *recorder, checked chan struct{}) {
	src := t.TempDir()
	writeFile(t, src, "f", randomBytes(50000, 1))
	opts, io := testOptions()
	checked = make(chan struct{}, 16)
	ar := newAfterRead(opts, func(o *triggers.AfterReadOptions) {
		o.DeferLimit = 0
		o.PageCache = func(string) (int64, bool) {
			checked <- struct{}{}
			return 1, false // the reader still reads it
		}
		o.SettleTick = func(string) <-chan time.Time { return nil } // never
	})
	c, err := New(ctx, Config{Source: src, Options: opts, IO: io, AfterRead: ar,
		Devices: []gpu.Device{newFake(int64(opts.ChunkSize))}, Queue: newQueue(opts, zap.NewNop()),
		ReadAhead: readahead.NewExecutor(nil), Log: zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	core = &lastCloseCore{Cache: c, ended: make(chan struct{}, 16)}
	ar.Attach(core) // before any open: New attached the cache itself
	return c, core, record(t, c), checked
}

// closeWithStepsBetween closes f (R1) with steps run right after the
// close's first question to the cache, or after the close where it asks
// none.
func closeWithStepsBetween(c *Cache, core *lastCloseCore, steps func()) {
	core.arm(steps)
	c.Closed("f") // R1
	if step := core.disarm(); step != nil {
		step()
	}
}

// TestLastCloseAfterTheEntryLeftWaitsForTheReaders: two readers, R1 and
// R2, close f while its resident entry leaves the cache (a change, or
// LRU). Whichever close is the last counts down after the drop, finds f
// not staged and waits for the readers (settling: page cache, mappings),
// as when a close was one step under Cache.mu. R1's close starts first;
// the drop and R2's close come right after R1's first question to the
// cache (where Closed asks before it counts down, R1's close is then the
// last, with an answer from before the drop: staged, a staging queued at
// once), or after R1's close where it asks the cache nothing.
func TestLastCloseAfterTheEntryLeftWaitsForTheReaders(t *testing.T) {
	c, core, rec, checked := lastCloseCache(t, context.Background())
	if _, err := c.Stage(context.Background(), "f"); err != nil {
		t.Fatal(err)
	}
	rec.waitFor(t, "f", StateResident)
	c.Opened("f") // R1
	c.Opened("f") // R2
	closeWithStepsBetween(c, core, func() {
		c.Changed("f") // the resident entry leaves
		rec.waitFor(t, "f", StateAbsent)
		c.Closed("f") // R2
	})
	if n, q := settlingWaits(c), core.queued.Load(); n != 1 || q != 0 {
		t.Fatalf("last close of f, not staged when it counted down: %d settling waits, %d stagings queued at once; want 1, 0", n, q)
	}
	within(t, "the settling wait's page cache check", func() { <-checked })
}

// TestLastCloseAfterTheFileWasStagedStagesAtOnce: the reverse: R1 and R2
// close f while a lease stages it, placed as above. The last close,
// counted down with f resident, queues its staging at once (a hit), with
// no settling wait and no page cache check (TestNoSettlingForAStagedFile).
func TestLastCloseAfterTheFileWasStagedStagesAtOnce(t *testing.T) {
	c, core, rec, checked := lastCloseCache(t, context.Background())
	c.Opened("f") // R1
	c.Opened("f") // R2
	closeWithStepsBetween(c, core, func() {
		if _, err := c.Stage(context.Background(), "f"); err != nil { // f staged meanwhile
			t.Error(err)
		}
		rec.waitFor(t, "f", StateResident)
		c.Closed("f") // R2
	})
	if n, q := settlingWaits(c), core.queued.Load(); n != 0 || q != 1 {
		t.Fatalf("last close of f, resident when it counted down: %d settling waits, %d stagings queued at once; want 0, 1", n, q)
	}
	if len(checked) != 0 {
		t.Fatal("the page cache of f, resident, was checked")
	}
}

// TestLastCloseOneAfterAnotherWaitsForTheReaders: the steps of
// TestLastCloseAfterTheEntryLeftWaitsForTheReaders one after another
// (drop, R2's close, R1's close): the last close waits (settles).
func TestLastCloseOneAfterAnotherWaitsForTheReaders(t *testing.T) {
	c, core, rec, checked := lastCloseCache(t, context.Background())
	if _, err := c.Stage(context.Background(), "f"); err != nil {
		t.Fatal(err)
	}
	rec.waitFor(t, "f", StateResident)
	c.Opened("f")
	c.Opened("f")
	c.Changed("f")
	rec.waitFor(t, "f", StateAbsent)
	c.Closed("f")
	c.Closed("f")
	if n, q := settlingWaits(c), core.queued.Load(); n != 1 || q != 0 {
		t.Fatalf("%d settling waits, %d stagings queued at once; want 1, 0", n, q)
	}
	within(t, "the settling wait's page cache check", func() { <-checked })
}

// TestSettlingEndsWithTheCachesContext: cancelling the context the cache
// was made with ends a settling wait (its goroutine returns, before
// Close), and no staging is queued for it.
func TestSettlingEndsWithTheCachesContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c, core, _, checked := lastCloseCache(t, ctx)
	c.Opened("f")
	c.Closed("f")
	within(t, "the settling wait's page cache check", func() { <-checked })
	cancel()
	within(t, "the settling wait after the cache's context ended", func() { <-core.ended })
	if q := core.queued.Load(); q != 0 {
		t.Fatalf("%d stagings queued after the cache's context ended, want 0", q)
	}
}
