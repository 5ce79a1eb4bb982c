package staging

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"os"
	"sync"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/gpu"
)

// Config is what New needs.
type Config struct {
	Source  string // the directory files are staged from
	Options Options
	IO      IOOptions
	Devices []gpu.Device // one slot each; staging.gpus order
	Log     *zap.Logger
}

// Cache stages files of SOURCE onto devices.
//
// An entry's life, one file each, read in this order: life1_lookup.go (a
// request finds or starts an entry), life2_load.go (room is reserved and
// the file is read onto the device, by loader.go's workers),
// life3_publish.go (the load's end is made visible), life4_evict.go (the
// entry leaves: evicted, invalidated, freed). Leases (lease.go) pin
// resident entries in between.
//
// Lock order: Cache.mu, then events.mu. No I/O or device call is made with
// mu held.
type Cache struct {
	opts   Options
	io     IOOptions
	root   *os.File // SOURCE, for openat2(RESOLVE_BENEATH)
	filter *filter
	slots  []*slot
	log    *zap.Logger
	stats  counters

	sourceDev uint64 // SOURCE's filesystem
	events    *events
	watch     *watcher
	hooks     hooks

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup // prefetch workers, loads, loader workers
	queue  chan string

	mu      sync.Mutex
	entries map[string]*entry           // attached entries by SOURCE-relative path
	byFID   map[fid]map[*entry]struct{} // entries with change events, by file
	queued  map[string]bool             // paths waiting in queue
	gen     uint64                      // last generation handed out
	closed  bool
}

// hooks let tests see points that are not state changes. Nil in
// production; set before the cache is used.
type hooks struct {
	joined       func(rel string) // a request joined a load in flight
	prefetchDone func(rel string) // a prefetch worker finished with rel
	racyWait     func(rel string) // a load starts waiting out the racy window
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
	root, err := os.Open(cfg.Source)
	if err != nil {
		return nil, fmt.Errorf("staging: SOURCE: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	c := &Cache{
		opts: cfg.Options, io: cfg.IO, root: root, filter: flt,
		log: cfg.Log.Named("staging"), ctx: ctx, cancel: cancel, events: newEvents(),
		queue:   make(chan string, cfg.Options.PrefetchQueue),
		entries: map[string]*entry{}, queued: map[string]bool{}, byFID: map[fid]map[*entry]struct{}{},
	}
	c.watch = newWatcher(cfg.Options.Watch, c.log, c.changedFID, c.changedAll)
	c.watchSource()
	for _, d := range cfg.Devices {
		free, _, err := d.MemInfo()
		if err != nil {
			cancel()
			c.wg.Wait() // the loaders of the slots made so far
			c.watch.close()
			c.events.close()
			root.Close()
			return nil, fmt.Errorf("staging: %s: %w", d.Name(), err)
		}
		capacity := cfg.Options.Capacity.Resolve(free)
		s := &slot{dev: d, capacity: capacity, lru: list.New()}
		s.loader = newLoader(c, s)
		c.slots = append(c.slots, s)
		c.log.Info("device slot", zap.String("device", d.Name()), zap.Int64("capacity_bytes", capacity))
	}
	for range cfg.Options.PrefetchWorkers {
		c.wg.Add(1)
		go c.prefetchWorker()
	}
	return c, nil
}

// Close stops the workers, waits for loads in flight and frees every
// region, leased or not: leases end with the cache.
func (c *Cache) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.mu.Unlock()
	c.cancel()
	c.wg.Wait()
	c.watch.close()
	c.mu.Lock()
	var regions []gpu.Region
	for _, e := range c.entries {
		if e.region != nil {
			regions = append(regions, e.region)
			e.region = nil
		}
	}
	c.entries = map[string]*entry{}
	c.mu.Unlock()
	for _, r := range regions {
		freeRegion(r)
	}
	c.events.close()
	return c.root.Close()
}

// open opens rel beneath SOURCE (symlinks may not leave it). It asks for
// O_NOATIME so staging leaves SOURCE's metadata as it was, where the
// daemon may (it owns the file, or is root).
func (c *Cache) open(rel string, flags int) (*os.File, error) {
	how := &unix.OpenHow{
		Flags:   uint64(flags | unix.O_CLOEXEC | unix.O_NOATIME),
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS,
	}
	fd, err := unix.Openat2(int(c.root.Fd()), rel, how)
	if errors.Is(err, unix.EPERM) {
		how.Flags &^= unix.O_NOATIME
		fd, err = unix.Openat2(int(c.root.Fd()), rel, how)
	}
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: rel, Err: err}
	}
	return os.NewFile(uintptr(fd), rel), nil
}

// watchSource marks SOURCE's own filesystem now, so stats tell from the
// start how changes are detected there.
func (c *Cache) watchSource() {
	var st unix.Stat_t
	if err := unix.Fstat(int(c.root.Fd()), &st); err == nil {
		c.sourceDev = st.Dev
		c.watch.probe(c.root, st.Dev)
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
