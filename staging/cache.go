package staging

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
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
// Lock order: Cache.mu, then nothing. No I/O or device call is made with
// mu held.
type Cache struct {
	opts   Options
	io     IOOptions
	root   *os.File // SOURCE, for openat2(RESOLVE_BENEATH)
	filter *filter
	slots  []*slot
	log    *zap.Logger
	stats  counters

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup // prefetch workers, loads, loader workers
	queue  chan string

	mu      sync.Mutex
	entries map[string]*entry // attached entries by SOURCE-relative path
	queued  map[string]bool   // paths waiting in queue
	gen     uint64            // last generation handed out
	closed  bool
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
		log: cfg.Log.Named("staging"), ctx: ctx, cancel: cancel,
		queue:   make(chan string, cfg.Options.PrefetchQueue),
		entries: map[string]*entry{}, queued: map[string]bool{},
	}
	for _, d := range cfg.Devices {
		free, _, err := d.MemInfo()
		if err != nil {
			cancel()
			c.wg.Wait() // the loaders of the slots made so far
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
		r.Free()
	}
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

// Opened is the FUSE open trigger: with staging.prefetch=open it queues
// rel; otherwise it only drops a stale entry. It never blocks.
func (c *Cache) Opened(rel string) {
	if c.opts.Prefetch == PrefetchOpen {
		c.Prefetch(rel)
		return
	}
	c.mu.Lock()
	_, staged := c.entries[rel]
	c.mu.Unlock()
	if staged {
		c.checkIdentity(rel)
	}
}

// Changed tells the cache that rel was changed through the mount (a
// write, truncation, attribute change, unlink or rename): its entry is
// dropped so no later lease sees the old bytes. It never blocks on a load.
func (c *Cache) Changed(rel string) {
	c.mu.Lock()
	var r gpu.Region
	if e := c.entries[rel]; e != nil {
		r = c.dropLocked(e)
		c.stats.invalidations.Add(1)
	}
	c.mu.Unlock()
	freeRegion(r)
}

// Closed tells the cache that one open of rel through the mount ended.
func (c *Cache) Closed(rel string) {}

// Prefetch queues rel for staging. It drops the request (and returns
// false) when the queue is full, and ignores a path already queued.
func (c *Cache) Prefetch(rel string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return false
	}
	if c.queued[rel] {
		return true
	}
	select {
	case c.queue <- rel:
		c.queued[rel] = true
		c.stats.prefetches.Add(1)
		return true
	default:
		c.stats.prefetchDropped.Add(1)
		return false
	}
}

func (c *Cache) prefetchWorker() {
	defer c.wg.Done()
	for {
		select {
		case <-c.ctx.Done():
			return
		case rel := <-c.queue:
			// rel stays in queued until staged, so a queued file never
			// reads as absent and is not queued twice meanwhile.
			if _, err := c.Stage(c.ctx, rel); err != nil {
				c.log.Debug("prefetch", zap.String("path", rel), zap.Error(err))
			}
			c.mu.Lock()
			delete(c.queued, rel)
			c.mu.Unlock()
		}
	}
}

// Stage makes rel resident (loading it if needed) and returns its
// description. It waits for the load, bounded by ctx.
func (c *Cache) Stage(ctx context.Context, rel string) (Info, error) {
	e, err := c.ensure(ctx, rel)
	if err != nil {
		return Info{}, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return e.infoLocked(), nil
}

// Evict drops rel unless it is leased or loading.
func (c *Cache) Evict(rel string) error {
	c.mu.Lock()
	e := c.entries[rel]
	switch {
	case e == nil:
		c.mu.Unlock()
		return errNotStaged(rel)
	case e.leases > 0:
		c.mu.Unlock()
		return errBusy(rel, fmt.Sprintf("%d leases hold it", e.leases))
	case e.state == StateLoading:
		c.mu.Unlock()
		return errBusy(rel, "loading")
	}
	r := c.dropLocked(e)
	c.stats.evictions.Add(1)
	c.mu.Unlock()
	freeRegion(r)
	return nil
}

// Attr answers the user.gdsfs.state and user.gdsfs.path xattrs, after
// checking that the staged bytes still match the file. A file waiting in
// the prefetch queue is loading.
func (c *Cache) Attr(rel string) (state, path string) {
	c.checkIdentity(rel)
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.entries[rel]
	switch {
	case e == nil && c.queued[rel]:
		return StateLoading, "" // queued: it will load
	case e == nil:
		return StateAbsent, ""
	}
	info := e.infoLocked()
	return info.State, info.LoadPath
}

// Entries describes every attached entry, sorted by path.
func (c *Cache) Entries() []Info {
	c.mu.Lock()
	out := make([]Info, 0, len(c.entries))
	for _, e := range c.entries {
		out = append(out, e.infoLocked())
	}
	c.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out
}

// checkIdentity drops the entry of rel if the file changed or vanished.
func (c *Cache) checkIdentity(rel string) {
	var id identity
	var st unix.Stat_t
	err := unix.Fstatat(int(c.root.Fd()), rel, &st, 0)
	if err == nil {
		id = identityOf(&st)
	}
	c.mu.Lock()
	e := c.entries[rel]
	var r gpu.Region
	if e != nil && e.state != StateLoading && (err != nil || e.id != id) {
		r = c.dropLocked(e)
		c.stats.invalidations.Add(1)
	}
	c.mu.Unlock()
	freeRegion(r)
}

// dropLocked detaches e from the map and the LRU. If no lease holds it, its
// reservation is released and its region returned for the caller to free
// after unlocking; otherwise the last Release frees it. Cache.mu must be
// held.
func (c *Cache) dropLocked(e *entry) gpu.Region {
	if c.entries[e.rel] == e {
		delete(c.entries, e.rel)
	}
	e.detached = true
	if e.elem != nil {
		e.slot.lru.Remove(e.elem)
		e.elem = nil
	}
	if e.leases > 0 || e.state == StateLoading {
		return nil // freed by the last Release, or by the load's end
	}
	return c.releaseLocked(e)
}

// releaseLocked returns e's reservation to its slot and hands back its
// region. Cache.mu must be held.
func (c *Cache) releaseLocked(e *entry) gpu.Region {
	e.slot.used -= e.reserved
	e.reserved = 0
	r := e.region
	e.region = nil
	if e.state == StateResident {
		e.state = StateAbsent
	}
	return r
}

// detachVictimsLocked removes entries evicted by slot.reserveLocked (their
// reservation is already returned) and hands back their regions for the
// caller to free after unlocking. Cache.mu must be held.
func (c *Cache) detachVictimsLocked(victims []*entry) []gpu.Region {
	var regions []gpu.Region
	for _, v := range victims {
		if c.entries[v.rel] == v {
			delete(c.entries, v.rel)
		}
		v.detached, v.reserved, v.state = true, 0, StateAbsent
		regions = append(regions, v.region)
		v.region = nil
	}
	c.stats.evictions.Add(uint64(len(victims)))
	return regions
}

func freeRegion(r gpu.Region) {
	if r != nil {
		r.Free()
	}
}

// Eligible checks that rel could be staged: a regular file under SOURCE
// that the options let through and that fits a device's capacity.
func (c *Cache) Eligible(rel string) error {
	f, id, err := c.openEligible(rel)
	if err != nil {
		return err
	}
	f.Close()
	var need int64
	for _, s := range c.slots {
		if need = s.need(id.size, int64(c.opts.ChunkSize)); need <= s.capacity {
			return nil
		}
	}
	return errTooLarge(rel, need, c.slots[0].capacity)
}
