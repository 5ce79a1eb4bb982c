package staging

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/gpu"
	"github.com/gdsfs/gdsfs/internal/access"
	"github.com/gdsfs/gdsfs/internal/units"
	"github.com/gdsfs/gdsfs/staging/loader"
	"github.com/gdsfs/gdsfs/staging/triggers/readahead"
)

// Config is what New needs.
type Config struct {
	Source  string       // the directory files are staged from
	Root    *access.Root // SOURCE held open (optional: New opens Source)
	Options Options
	IO      IOOptions
	Devices []gpu.Device // one slot each; staging.gpus order
	Log     *zap.Logger
	// NoFile is the descriptor limit the budget is taken from (fdbudget.go);
	// 0: this process's soft RLIMIT_NOFILE.
	NoFile uint64
	// Queue is the prefetch queue (staging/triggers.NewQueue, sized by
	// Options.PrefetchQueue and PrefetchWorkers); nil: every prefetch is
	// dropped. The cache starts its workers and waits for them in Close.
	Queue Queue
	// AfterRead is the staging after plain reads through the mount
	// (staging/triggers.NewAfterRead, for staging.defer_while_read); nil:
	// a deferred open is staged at once. The cache waits for its
	// goroutines in Close.
	AfterRead AfterRead
	// ReadAhead carries out read-ahead's plans (staging/triggers/readahead
	// .NewExecutor); the cache runs it and waits for it in Close. Nil:
	// the cache still runs the planner (opens, leases and replays feed
	// it, its counters and the trace are kept) but carries out none of
	// its plans: nothing is loaded ahead, and a file a replay asks for
	// reads as loading until it is accessed.
	ReadAhead ReadAhead
	// manualReadAhead leaves the executor unstarted: tests carry out the
	// plans themselves (Executor.Carry(c.ra.Drain())).
	manualReadAhead bool
}

// Cache stages files of SOURCE onto devices.
//
// An entry's life, one file each, read in this order: life1_lookup.go (a
// request finds or starts an entry), life2_load.go (room is reserved and
// the file is read onto the device, by the slot's staging/loader),
// life3_publish.go (the load's end is made visible), life4_evict.go (the
// entry leaves: evicted, invalidated, freed). Leases (lease.go) pin
// resident entries in between.
//
// # Lock order
//
// A lock may be taken while holding only the locks listed before it:
//
//  1. watcher.drainMu (watch.go): change events are handled with it held,
//     and the handler takes Cache.mu.
//  2. Cache.mu: the entries, their states, the slots' accounting, the
//     counts of queued paths, the waiters for room.
//  3. Leaves, taken with or without Cache.mu and never holding another
//     lock: events.mu and subscription.mu (events.go), counters.errMu
//     (stats.go), watcher.mu (watch.go), the prefetch queue's
//     triggers.Queue.mu (the cache calls Offer, Len and a request's
//     forget with Cache.mu held; the queue's workers call stageQueued and
//     queuedDone holding none of its locks), the staging after reads'
//     triggers.AfterRead.mu (the cache asks Reading, Deferred, Cancel,
//     Stop, Open with Cache.mu held; AfterRead calls the cache,
//     triggers.AfterReadCore, with its own lock released), and the
//     read-ahead runner's and planner's locks (readahead.Runner.mu,
//     ReadAhead.mu, Recorder.mu, the replay's wantMu): the cache tells the runner of accesses with
//     Cache.mu held, and of background loads through their trigger's
//     hooks (triggers.Background: Admit, MayEvict, Observe), which it
//     calls with Cache.mu held and which take only such leaves (the
//     read-ahead executor has no lock of its own: it calls the runner).
//     A trigger calls the cache (triggers.Core) only with none of its
//     own locks held: the read-ahead executor from the runner's
//     goroutine and the goroutines Cache.Go runs.
//  4. staging/loader's locks (Loader.mu, a job's errMu), one loader per
//     slot: never taken with Cache.mu held. The cache calls Loader.Load
//     unlocked; under Cache.mu it only clears a load's Background.Low (an
//     atomic) and calls Loader.Signal (a channel send that never blocks).
//
// No I/O or device call is made with Cache.mu held: regions leave the
// books under the lock and are freed after it (unlockFree).
//
// Take Cache.mu with c.lock and release it with c.unlock: in tests the
// unlock checks the invariants (checkInvariantsLocked) first.
type Cache struct {
	// Constant once New returns.
	opts      Options
	io        IOOptions
	root      *access.Root // SOURCE: every path is resolved beneath it
	ownRoot   bool         // root was opened by New: Close closes it
	filter    *filter
	slots     []*slot
	log       *zap.Logger
	sourceDev uint64 // SOURCE's filesystem
	fdBudget  int    // descriptors staged regions may hold
	fdReserve int    // the rest of the limit
	hooks     hooks
	ctx       context.Context
	cancel    context.CancelFunc
	queue     Queue     // the prefetch queue (prefetch.go); nil: none
	afterRead AfterRead // the staging after reads (readers.go); nil: none
	raExec    ReadAhead // carries out ra's plans (Config.ReadAhead); nil: none

	// afterReadCounters are afterRead's counters (deferred_opens,
	// mapped_read_waits); without one, counters of the cache's own that
	// only carry a predecessor's counts on to stats and a successor.
	afterReadCounters map[string]*atomic.Uint64

	// Synchronized by themselves (atomics, their own locks, channels).
	stats  counters
	events *events
	watch  *watcher
	ra     *readahead.Runner // read-ahead's planner and the access trace (readahead.go)
	wg     sync.WaitGroup    // loads, settling checks (each slot's loader waits for its own workers, the queue for its)

	// Mutable, guarded by mu.
	mu        sync.Mutex
	entries   map[string]copies           // attached entries by SOURCE-relative path, one per slot at most
	byFID     map[fid]map[*entry]struct{} // entries with change events, by file
	queued    map[string]int              // prefetch requests waiting in queue (or being staged), by path
	queuedOn  map[string]int              // those of them that name devices
	published uint64                      // loads ended (publish), numbering the "staged" log lines
	absentWhy map[string]string           // why a file last became absent (AbsentReason)
	waiters   waiters                     // waiting for room, first come first served (room.go)
	gen       uint64                      // last generation handed out
	fdsUsed   int                         // descriptors reserved by entries and private copies
	closed    bool
	handedOff bool // between Handoff and Resume: no load starts (handover.go)

	// INVARIANT: 0 <= fdsUsed <= fdBudget, and the attached entries hold
	// at most fdsUsed descriptors.
	// INVARIANT: every slot: 0 <= used <= capacity, and its attached
	// entries reserve at most used bytes.
	// INVARIANT: entries[rel] has one element per slot; a non-nil one is
	// attached (not detached), named rel and on that slot.
	// INVARIANT: a slot's LRU holds exactly its resident attached entries
	// that are in it (elem != nil), each resident, attached and on it.
}

// checkOnUnlock, when set (only by the package's tests, before any cache
// is made), makes every c.unlock check the invariants first.
var checkOnUnlock bool

// lock takes Cache.mu.
func (c *Cache) lock() { c.mu.Lock() }

// unlock releases Cache.mu, checking the invariants first in tests.
func (c *Cache) unlock() {
	if checkOnUnlock {
		c.checkInvariantsLocked()
	}
	c.mu.Unlock()
}

// hooks let tests see points that are not state changes. Nil in
// production; set before the cache is used.
type hooks struct {
	joined       func(rel string)           // a request joined a load in flight
	prefetchDone func(rel string)           // a prefetch worker finished with rel
	racyWait     func(rel string)           // a load starts waiting out the racy window
	directOpen   func(rel string)           // a load is about to open rel again with O_DIRECT
	waiting      func(rel string)           // a request (again) sleeps, waiting for room
	queued       func(rel string, low bool) // a load's tasks were queued for the workers
	adopting     func(rel string)           // Adopt imported rel's region, checked its identity, and attaches it now
	eligible     func(rel string)           // openEligible opens rel (as the daemon)
	unexecuted   func(p readahead.Plan)     // a Plan nobody carries out (Config.ReadAhead nil)
}

// New opens the cache and starts its workers; they stop when ctx is done
// or Close is called.
func New(ctx context.Context, cfg Config) (*Cache, error) {
	if err := cfg.Options.Validate(); err != nil {
		return nil, err
	}
	if err := cfg.IO.Validate(); err != nil {
		return nil, err
	}
	if len(cfg.Devices) == 0 {
		return nil, errors.New("staging: no device")
	}
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	flt, err := newFilter(&cfg.Options)
	if err != nil {
		return nil, err
	}
	if cfg.NoFile == 0 {
		if cfg.NoFile, err = noFile(); err != nil {
			return nil, fmt.Errorf("staging: %w", err)
		}
	}
	replay, err := readTrace(cfg)
	if err != nil {
		return nil, err
	}
	root, ownRoot := cfg.Root, false
	if root == nil {
		if root, err = access.OpenRoot(cfg.Source); err != nil {
			return nil, fmt.Errorf("staging: SOURCE: %w", err)
		}
		ownRoot = true
	}
	ctx, cancel := context.WithCancel(ctx)
	c := &Cache{
		opts: cfg.Options, io: cfg.IO.resolved(), root: root, ownRoot: ownRoot, filter: flt,
		log: cfg.Log.Named("staging"), ctx: ctx, cancel: cancel, events: newEvents(),
		queue:   cfg.Queue,
		entries: map[string]copies{}, queued: map[string]int{}, queuedOn: map[string]int{}, byFID: map[fid]map[*entry]struct{}{},
		absentWhy: map[string]string{}, afterRead: cfg.AfterRead,
	}
	c.afterReadCounters = afterReadCounters(cfg.AfterRead)
	c.ra = newRunner(cfg, root, c.log)
	c.log.Info("io", zap.Int("num_threads", int(c.io.NumThreads)), zap.Stringer("bounce_size", units.Size(c.io.BounceSize)),
		zap.Bool("threads_auto", cfg.IO.NumThreads.Auto()), zap.Bool("bounce_auto", cfg.IO.BounceSize.Auto()))
	c.fdBudget, c.fdReserve = fdBudget(cfg.NoFile)
	c.log.Info("descriptor budget", zap.Uint64("rlimit_nofile", cfg.NoFile),
		zap.Int("budget", c.fdBudget), zap.Int("reserve", c.fdReserve))
	c.watch = newWatcher(cfg.Options.Watch, c.log, c.changedFID, c.changedAll)
	c.watchSource()
	if err := c.openSlots(cfg.Devices); err != nil {
		cancel()
		c.wg.Wait()
		c.watch.close()
		c.events.close()
		if ownRoot {
			root.Close()
		}
		return nil, err
	}
	if c.queue != nil {
		c.queue.Run(c.ctx, c.stageQueued, c.queuedDone)
	}
	if c.afterRead != nil {
		c.afterRead.Attach(c)
	}
	c.startReadAhead(cfg, replay)
	return c, nil
}

// openSlots makes one slot per device, its capacity a share of the
// memory free now, and starts its loader; then learns which pairs copy
// replicas device to device (peers.go).
func (c *Cache) openSlots(devs []gpu.Device) error {
	var slots []*slot
	for i, d := range devs {
		free, _, err := d.MemInfo()
		if err != nil {
			for _, s := range slots {
				s.loader.Close() // the loaders of the slots made so far
			}
			return fmt.Errorf("staging: %s: %w", d.Name(), err)
		}
		capacity := c.opts.Capacity.Resolve(free)
		s := &slot{dev: d, index: i, capacity: capacity, lru: list.New(), peer: make([]bool, len(devs))}
		s.loader = loader.New(c.ctx, d, c.io.loaderOptions(), loader.Hooks{Queued: c.hookQueued})
		slots = append(slots, s)
		c.log.Info("device slot", zap.String("device", d.Name()), zap.Int64("capacity_bytes", capacity))
	}
	// The change watcher already runs and takes the lock: the slots are
	// published under it.
	c.lock()
	c.slots = slots
	c.unlock()
	c.openPeers()
	return nil
}

// Close stops the workers, waits for loads in flight and frees every
// region, leased or not: leases end with the cache.
func (c *Cache) Close() error {
	c.lock()
	if c.closed {
		c.unlock()
		return nil
	}
	c.closed = true
	if c.afterRead != nil {
		c.afterRead.Stop()
	}
	c.unlock()
	c.cancel()
	if c.queue != nil {
		c.queue.Wait() // before wg: a worker may still start a load
	}
	c.wg.Wait()
	for _, s := range c.slots {
		s.loader.Close()
	}
	c.watch.close()
	c.lock()
	var regions []gpu.Region
	for _, cs := range c.entries {
		for _, e := range cs {
			if e == nil {
				continue
			}
			if e.elem != nil {
				e.slot.lru.Remove(e.elem)
				e.elem = nil
			}
			if e.region != nil {
				regions = append(regions, e.region)
				e.region = nil
			}
		}
	}
	c.entries = map[string]copies{}
	c.unlockFree(regions...)
	c.events.close()
	if c.ownRoot {
		return c.root.Close()
	}
	return nil
}

// hookQueued tells the test hook, when one is set, that a load's tasks
// were queued for a loader's workers.
func (c *Cache) hookQueued(rel string, low bool) {
	if c.hooks.queued != nil {
		c.hooks.queued(rel, low)
	}
}

// openRegular opens rel beneath SOURCE (symlinks may not leave it) as
// the daemon, never blocking: anything but a regular file is refused
// (access.ErrNotRegular) before it could block in open or read. It asks
// for O_NOATIME so staging leaves SOURCE's metadata as it was, where the
// daemon may (it owns the file, or is root).
func (c *Cache) openRegular(rel string, extra int) (*os.File, *unix.Stat_t, error) {
	return c.root.OpenRegular(access.Daemon(), rel, unix.O_NOATIME|extra, access.Beneath)
}

// watchSource marks SOURCE's own filesystem now, so stats tell from the
// start how changes are detected there.
func (c *Cache) watchSource() {
	d, err := c.root.Open(".", unix.O_RDONLY|unix.O_DIRECTORY, 0, access.Beneath)
	if err != nil {
		return
	}
	defer d.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(d.Fd()), &st); err == nil {
		c.sourceDev = st.Dev
		c.watch.probe(d, st.Dev)
	}
}

// Devices names the devices files are staged onto.
func (c *Cache) Devices() []string {
	var out []string
	for _, s := range c.slots {
		out = append(out, s.dev.Name())
	}
	return out
}
