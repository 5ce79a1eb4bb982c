package staging

// Hand-over to a successor daemon. Handoff (or Snapshot, which stops
// nothing) describes every resident attached entry, each device's in its
// LRU order, and exports its region's descriptors; the successor's Adopt
// takes over those it can use: same device, same chunk layout, a file
// whose identity (dev, ino, size, mtime, ctime) is still the staged one,
// room. An adopted entry is resident as if it had just loaded (in its
// slot's LRU, counted against capacity and the descriptor budget, found
// by change events), with nothing read from SOURCE. The counters, the
// read-ahead clock, counters and trace continue. Loads in flight, failed
// entries, entries detached but still leased, private copies, leases,
// readers through the mount and the prefetch queue are not handed over:
// leases and opens belong to the lease socket and the mount, which hand
// over their own and acquire again.
//
// Between Handoff and Resume or Abandon no load starts: a request that
// needs one waits in the line for room (a prefetch or read-ahead is
// declined), and Resume lets the line go on. Hits are served throughout.

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/gdsfs/gdsfs/gpu"
	"github.com/gdsfs/gdsfs/staging/triggers/readahead"
)

// CacheVersion is the version of CacheState this package writes, and the
// only one Adopt reads.
const CacheVersion = 1

// CacheState is what a cache hands to its successor, beside the
// descriptors of its regions. encoding/json round-trips it.
type CacheState struct {
	Version int    `json:"version"`
	Source  string `json:"source"` // SOURCE as the predecessor opened it
	// Generation is the last generation handed out: the successor's
	// continue after it.
	Generation uint64 `json:"generation"`
	// Entries are the resident attached entries, device after device in
	// staging.gpus order, each device's most recently used first.
	Entries []EntryState `json:"entries"`
	// Counters are the cumulative counters by their stats.json keys;
	// Devices each device's (evictions, bytes_read, bytes_cufile,
	// bytes_peer) by device name.
	Counters  map[string]uint64            `json:"counters"`
	Devices   map[string]map[string]uint64 `json:"devices"`
	ReadAhead readahead.State              `json:"readahead"`
}

// EntryState is one resident entry.
type EntryState struct {
	Path   string `json:"path"`   // SOURCE-relative
	Device string `json:"device"` // gpu.Device.Name
	// The file's identity when it was staged: a file whose identity
	// differs now is not adopted.
	Dev     uint64 `json:"dev"`
	Ino     uint64 `json:"ino"`
	Size    int64  `json:"size"`
	MtimeNs int64  `json:"mtime_ns"`
	CtimeNs int64  `json:"ctime_ns"`

	Generation uint64  `json:"generation"`
	LoadPath   string  `json:"load_path"`
	Note       string  `json:"note,omitempty"` // why cuFile was not used
	LoadNs     int64   `json:"load_ns"`        // how long its load took
	LastUse    uint64  `json:"last_use"`       // a tick of ReadAhead.Clock
	Chunks     []int64 `json:"chunks"`
	// SeenNs is when the predecessor last knew the file unchanged (it had
	// handled every change event before it), in Unix nanoseconds.
	SeenNs int64 `json:"seen_ns"`
	// Files are the indexes, in the descriptors handed beside the state,
	// of the region's chunks (Region.Export), one per chunk.
	Files []int `json:"files"`
}

func (s EntryState) identity() identity {
	return identity{dev: s.Dev, ino: s.Ino, size: s.Size, mtime: s.MtimeNs, ctime: s.CtimeNs}
}

// AdoptReport says what Adopt took over and what it dropped.
type AdoptReport struct {
	Adopted int            `json:"adopted"`
	Bytes   int64          `json:"bytes"`
	Dropped []DroppedEntry `json:"dropped"`
}

// DroppedEntry is an entry Adopt did not take over, and why: it is read
// from SOURCE again when next needed.
type DroppedEntry struct {
	Path   string `json:"path"`
	Device string `json:"device"`
	Reason string `json:"reason"`
}

// Handoff stops new loads and returns the resident entries and their
// regions' descriptors (dups the caller closes); the cache keeps serving
// hits and holds everything it held. Resume undoes it; Abandon follows a
// successful hand-over.
func (c *Cache) Handoff() (CacheState, []*os.File, error) { return c.snapshot(true) }

// Snapshot is Handoff without stopping anything: what a successor would
// adopt now (for a store that outlives the process).
func (c *Cache) Snapshot() (CacheState, []*os.File, error) { return c.snapshot(false) }

// Resume undoes Handoff: loads start again, first the requests that
// waited for one.
func (c *Cache) Resume() error {
	c.lock()
	defer c.unlock()
	if c.closed {
		return errors.New("staging: resume: cache closed")
	}
	c.handedOff = false
	c.wakeLocked()
	return nil
}

// Abandon ends the cache after its successor adopted it: it stops the
// workers and frees this process's hold on every region (its memfds, its
// CUDA handles and mappings); the successor's descriptors and handles,
// and consumers', keep the memory. No event is emitted.
func (c *Cache) Abandon() {
	c.log.Info("handed over: freeing this process's hold on the staged regions")
	if err := c.Close(); err != nil {
		c.log.Warn("close after the hand-over", zap.Error(err))
	}
}

// snapshot is Handoff (pause) or Snapshot. Change events queued before it
// are handled first; the entries are described under the lock, their
// regions exported after it, and those dropped meanwhile left out.
func (c *Cache) snapshot(pause bool) (CacheState, []*os.File, error) {
	seen := time.Now()
	c.watch.drain()
	c.lock()
	if c.closed {
		c.unlock()
		return CacheState{}, nil, errors.New("staging: hand-over: cache closed")
	}
	c.handedOff = c.handedOff || pause
	st := CacheState{Version: CacheVersion, Source: c.root.Path(), Generation: c.gen}
	var held []*entry
	for _, s := range c.slots {
		for el := s.lru.Front(); el != nil; el = el.Next() {
			held = append(held, el.Value.(*entry))
		}
	}
	sts, regions := c.pinForExportLocked(held, seen)
	c.unlock()
	var files []*os.File
	st.Entries, files = c.exportPinned(held, sts, regions)
	st.Counters, st.Devices = c.counterSnapshot(), c.slotCounters()
	st.ReadAhead = c.ra.State()
	return st, files, nil
}

// ExportEntry describes rel's resident entry on device (gpu.Device.Name)
// and exports its region (dups the caller closes); Files index the
// returned descriptors. With Subscribe's resident and absent events it
// keeps a store of the staged regions up to date without a Snapshot of
// everything. ENOENT: no such resident entry.
func (c *Cache) ExportEntry(rel, device string) (EntryState, []*os.File, error) {
	seen := time.Now()
	c.watch.drain()
	c.lock()
	var e *entry
	if s, ok := c.slotFor(device); ok {
		e = c.onLocked(rel, s)
	}
	if e == nil || e.state != stResident {
		c.unlock()
		return EntryState{}, nil, fmt.Errorf("export %s on %s: %w", rel, device, errNotStaged(rel))
	}
	sts, regions := c.pinForExportLocked([]*entry{e}, seen)
	c.unlock()
	out, files := c.exportPinned([]*entry{e}, sts, regions)
	if len(out) == 0 {
		return EntryState{}, nil, fmt.Errorf("export %s on %s: %w", rel, device, errNotStaged(rel))
	}
	return out[0], files, nil
}

// pinForExportLocked pins es (resident) so that they are neither evicted
// nor freed while their regions are exported, and describes them as
// known unchanged at seen. Cache.mu must be held.
func (c *Cache) pinForExportLocked(es []*entry, seen time.Time) ([]EntryState, []gpu.Region) {
	sts := make([]EntryState, len(es))
	regions := make([]gpu.Region, len(es))
	for i, e := range es {
		e.pins++
		sts[i], regions[i] = e.handOverLocked(), e.region
		sts[i].SeenNs = seen.UnixNano()
	}
	return sts, regions
}

// exportPinned exports the regions of es (pinned by pinForExportLocked)
// outside the lock, then unpins them. It returns the descriptions of
// those still attached, with the indexes of their descriptors in files.
func (c *Cache) exportPinned(es []*entry, sts []EntryState, regions []gpu.Region) ([]EntryState, []*os.File) {
	exported := make([][]*os.File, len(es))
	for i, r := range regions {
		fs, err := r.Export()
		if err != nil {
			c.log.Warn("hand-over: export failed; not handed over", zap.String("path", sts[i].Path),
				zap.String("device", sts[i].Device), zap.Error(err))
			continue
		}
		exported[i] = fs
	}
	var out []EntryState
	var files []*os.File
	var free []gpu.Region
	c.lock()
	for i, e := range es {
		switch {
		case e.detached: // dropped meanwhile: changed, or evicted on request
			closeFiles(exported[i])
		case exported[i] != nil:
			for _, f := range exported[i] {
				sts[i].Files = append(sts[i].Files, len(files))
				files = append(files, f)
			}
			out = append(out, sts[i])
		}
		free = append(free, c.unpinLocked(e))
	}
	c.unlockFree(free...)
	return out, files
}

// handOverLocked describes resident e for a successor, without its
// descriptors. Cache.mu must be held.
func (e *entry) handOverLocked() EntryState {
	return EntryState{
		Path: e.rel, Device: e.slot.dev.Name(),
		Dev: e.id.dev, Ino: e.id.ino, Size: e.id.size, MtimeNs: e.id.mtime, CtimeNs: e.id.ctime,
		Generation: e.gen, LoadPath: e.path, Note: e.reason, LoadNs: int64(e.loadDur), LastUse: e.lastUse,
		Chunks: e.region.Chunks(),
	}
}

func closeFiles(fs []*os.File) {
	for _, f := range fs {
		f.Close()
	}
}

// Adopt takes over what a predecessor handed over (Handoff, Snapshot),
// right after New and before serving: each entry it can use becomes
// resident here with nothing read from SOURCE, the rest is dropped, each
// with a log line and a line in the report. The files stay the caller's
// (adopted regions hold their own references). The counters continue
// from the predecessor's. A state of another Version is refused whole.
func (c *Cache) Adopt(st CacheState, files []*os.File) (AdoptReport, error) {
	rep := AdoptReport{Dropped: []DroppedEntry{}}
	if st.Version != CacheVersion {
		return rep, fmt.Errorf("staging: hand-over state of version %d: this gdsfs reads version %d only", st.Version, CacheVersion)
	}
	if st.Source != c.root.Path() {
		c.log.Warn("hand-over from a daemon of another SOURCE path: entries are kept where the file is the one staged",
			zap.String("predecessor_source", st.Source), zap.String("source", c.root.Path()))
	}
	c.addCounters(st.Counters)
	c.addSlotCounters(st.Devices)
	c.ra.Adopt(st.ReadAhead)
	c.lock()
	base := c.gen // generations this cache handed out itself
	c.gen = max(c.gen, st.Generation)
	c.unlock()
	for _, es := range st.Entries {
		if err := c.adoptEntry(es, files, base); err != nil {
			rep.Dropped = append(rep.Dropped, DroppedEntry{Path: es.Path, Device: es.Device, Reason: err.Error()})
			c.log.Warn("hand-over: entry dropped; read again when next needed", zap.String("path", es.Path),
				zap.String("device", es.Device), zap.Error(err))
			continue
		}
		rep.Adopted++
		rep.Bytes += es.Size
	}
	c.log.Info("hand-over: adopted", zap.Int("files", rep.Adopted), zap.Int64("bytes", rep.Bytes),
		zap.Int("dropped", len(rep.Dropped)))
	return rep, nil
}

// adoptEntry makes es resident here, or says why not.
func (c *Cache) adoptEntry(es EntryState, files []*os.File, base uint64) error {
	s, imp, err := c.adoptSlot(es)
	if err != nil {
		return err
	}
	fs, err := handedFiles(es, files)
	if err != nil {
		return err
	}
	o, err := c.openEligible(es.Path) // watched from now on, then its identity taken
	if err != nil {
		return fmt.Errorf("not adopted: %w", err)
	}
	defer o.f.Close()
	if o.id != es.identity() {
		return errors.New("the file changed since it was staged")
	}
	if err := c.racyHandOver(es); err != nil {
		return err
	}
	need, fds := c.adoptNeed(s, es)
	c.lock()
	err = c.adoptRoomLocked(es.Path, o.id, s, need, fds)
	c.unlock()
	if err != nil {
		return err // before importing anything
	}
	r, err := imp.Import(fs, es.Chunks, es.Size)
	if err != nil {
		return err
	}
	if c.hooks.adopting != nil {
		c.hooks.adopting(es.Path)
	}
	c.lock()
	if err := c.adoptRoomLocked(es.Path, o.id, s, need, fds); err != nil {
		c.unlockFree(r)
		return err
	}
	e := c.residentAdoptedLocked(es, o, s, r, need, fds, base)
	c.unlock()
	// Found by change events from now on; a change that came before is
	// seen here, as a load checks at its end.
	if now, _, err := fileIdentity(o.f); err != nil || now != e.id {
		var r gpu.Region
		c.lock()
		if !e.detached { // not dropped by its change event already
			c.stats.invalidations.Add(1)
			r = c.dropLocked(e, "changed")
		}
		c.unlockFree(r)
		return errors.New("the file changed while it was adopted")
	}
	return nil
}

// residentAdoptedLocked makes the entry of es, opened as o, resident on
// s with region r, reserving need bytes and fds descriptors, behind the
// entries adopted before it in s's LRU; generations up to base are this
// cache's own. Cache.mu must be held.
func (c *Cache) residentAdoptedLocked(es EntryState, o *opened, s *slot, r gpu.Region, need int64, fds int, base uint64) *entry {
	gen := es.Generation
	if gen == 0 || gen <= base {
		gen = c.genLocked(es.Path, o.id)
	}
	e := &entry{
		rel: es.Path, id: o.id, fid: o.fid, events: o.events, slot: s, gen: gen, done: make(chan struct{}),
		state: stLoading, reserved: need, fds: fds, lastUse: es.LastUse,
		path: es.LoadPath, loadDur: time.Duration(es.LoadNs),
	}
	s.used += need
	c.fdsUsed += fds
	c.attachLocked(e)
	c.indexLocked(e)
	e.moveLocked(stResident)
	e.reason, e.region = es.Note, r
	e.elem = s.lru.PushBack(e) // the predecessor's order: most recent first
	close(e.done)
	ev := e.eventLocked(stResident, es.Note)
	ev.Duration, ev.HandedOver = 0, true
	c.emitLocked(ev)
	return e
}

// adoptNeed is the room es takes on s: what a load of it would reserve,
// or more where the predecessor's chunks (another staging.chunk_size)
// hold more bytes or descriptors (a device that holds descriptors holds
// one per chunk: gpu.Device.HeldDescriptors).
func (c *Cache) adoptNeed(s *slot, es EntryState) (int64, int) {
	need, fds := s.need(es.Size, int64(c.opts.ChunkSize)), s.dev.HeldDescriptors(es.Size)
	var held int64
	for _, n := range es.Chunks {
		held += n
	}
	if fds > 0 {
		fds = max(fds, len(es.Chunks))
	}
	return max(need, held), fds
}

// racyHandOver refuses es when a write the predecessor did not see could
// have left the file's stamps as they were (racy.go): one that began
// within the timestamp granularity of the stamp, when the predecessor
// last saw the file less than staging.racy_window after that stamp. A
// stamp further ahead than the window cannot be one a write running now
// made.
func (c *Cache) racyHandOver(es EntryState) error {
	window := c.opts.RacyWindow
	stamp := time.Unix(0, max(es.MtimeNs, es.CtimeNs))
	seen := time.Unix(0, es.SeenNs)
	if window <= 0 || !seen.Before(stamp.Add(window)) || stamp.After(seen.Add(window)) {
		return nil
	}
	return fmt.Errorf("its stamp %s is within staging.racy_window (%s) of %s, when the predecessor last saw it: a change since could have kept it",
		stamp.Format(time.RFC3339Nano), window, seen.Format(time.RFC3339Nano))
}

// adoptSlot is the slot of es's device, and its importer.
func (c *Cache) adoptSlot(es EntryState) (*slot, gpu.Importer, error) {
	i := slices.IndexFunc(c.slots, func(s *slot) bool { return s.dev.Name() == es.Device })
	if i < 0 {
		return nil, nil, fmt.Errorf("device %s is not among this daemon's (%s)", es.Device, c.deviceList())
	}
	s := c.slots[i]
	imp, ok := s.dev.(gpu.Importer)
	if !ok {
		return nil, nil, fmt.Errorf("device %s (%s backend) cannot take over another process's regions", es.Device, s.dev.Kind())
	}
	return s, imp, nil
}

// handedFiles picks es's descriptors out of files.
func handedFiles(es EntryState, files []*os.File) ([]*os.File, error) {
	if len(es.Files) != len(es.Chunks) {
		return nil, fmt.Errorf("%d descriptors for %d chunks", len(es.Files), len(es.Chunks))
	}
	out := make([]*os.File, len(es.Files))
	for i, k := range es.Files {
		if k < 0 || k >= len(files) || files[k] == nil {
			return nil, fmt.Errorf("descriptor %d of %d handed over: none", k, len(files))
		}
		out[i] = files[k]
	}
	return out, nil
}

// adoptRoomLocked says why an entry of rel with identity id cannot be
// adopted on s now (nil: it can): the cache closed, rel is staged there
// already or elsewhere as another file, or need bytes and fds
// descriptors do not fit (adopting evicts nothing). Cache.mu must be
// held.
func (c *Cache) adoptRoomLocked(rel string, id identity, s *slot, need int64, fds int) error {
	switch {
	case c.closed:
		return errors.New("cache closed")
	case c.onLocked(rel, s) != nil:
		return fmt.Errorf("staged on %s already", s.dev.Name())
	case slices.ContainsFunc(c.replicasLocked(rel), func(e *entry) bool { return e.id != id }):
		return errors.New("staged here already as another version of the file")
	case !c.fitsLocked(s, need, fds):
		return fmt.Errorf("no room on %s: %d bytes and %d descriptors needed, %d bytes and %d descriptors free",
			s.dev.Name(), need, fds, s.capacity-s.used, c.fdBudget-c.fdsUsed)
	}
	return nil
}

// cumulative names the counters that continue across a hand-over by
// their stats.json keys (leases_pinned, a count of now, is not one).
func (s *counters) cumulative() map[string]*atomic.Uint64 {
	return map[string]*atomic.Uint64{
		"prefetches": &s.prefetches, "prefetch_dropped": &s.prefetchDropped,
		"hits": &s.hits, "misses": &s.misses, "shared_loads": &s.sharedLoads,
		"evictions": &s.evictions, "invalidations": &s.invalidations, "load_errors": &s.loadErrors,
		"too_large": &s.tooLarge, "no_space": &s.noSpace, "cufile_fallbacks": &s.cufileFallbacks,
		"bytes_cufile": &s.bytesCuFile, "bytes_posix": &s.bytesPOSIX, "bytes_host": &s.bytesHost,
		"leases_total": &s.leasesTotal, "change_events": &s.changeEvents, "racy_waits": &s.racyWaits,
		"load_retries": &s.loadRetries, "free_errors": &s.freeErrors, "room_waits": &s.roomWaits,
		"yielded_to_readers": &s.yielded, "bytes_peer": &s.bytesPeer, "split_loads": &s.splitLoads,
	}
}

// cumulative is every counter that continues across a hand-over: the
// cache's and the staging after reads' (deferred_opens,
// mapped_read_waits; carried on without a staging after reads too).
func (c *Cache) cumulative() map[string]*atomic.Uint64 {
	m := c.stats.cumulative()
	maps.Copy(m, c.afterReadCounters)
	return m
}

func (c *Cache) counterSnapshot() map[string]uint64 {
	out := map[string]uint64{}
	for k, v := range c.cumulative() {
		out[k] = v.Load()
	}
	return out
}

// addCounters adds a predecessor's counters; keys this version does not
// know are ignored.
func (c *Cache) addCounters(m map[string]uint64) {
	for k, v := range c.cumulative() {
		v.Add(m[k])
	}
}

// cumulative is a slot's counters by their stats.json keys.
func (s *slot) cumulative() map[string]*atomic.Uint64 {
	return map[string]*atomic.Uint64{
		"evictions": &s.evictions, "bytes_read": &s.bytesRead, "bytes_cufile": &s.bytesCuFile, "bytes_peer": &s.bytesPeer,
	}
}

// slotCounters is every slot's counters by device name.
func (c *Cache) slotCounters() map[string]map[string]uint64 {
	out := map[string]map[string]uint64{}
	for _, s := range c.slots {
		m := map[string]uint64{}
		for k, v := range s.cumulative() {
			m[k] = v.Load()
		}
		out[s.dev.Name()] = m
	}
	return out
}

// addSlotCounters adds a predecessor's per-device counters to the slots
// of the same names.
func (c *Cache) addSlotCounters(devs map[string]map[string]uint64) {
	for _, s := range c.slots {
		for k, v := range s.cumulative() {
			v.Add(devs[s.dev.Name()][k])
		}
	}
}
