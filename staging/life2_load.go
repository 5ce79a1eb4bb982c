package staging

// An entry's life, step 2: room is reserved on a slot (evicting unleased
// entries in LRU order), the region allocated, and the file read into it
// on the cuFile or the POSIX path by the slot's loader (loader.go). The
// load checks at its end that the file did not change under it, then
// publishes (life3_publish.go).

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/gpu"
)

// startLocked creates a loading entry on want, or (nil) on the slot
// with the most room, evicting as needed, for the request in line as w
// (nil: not in line; admitLocked); at is the read-ahead clock's
// tick of the request (its last use). Where a replica of the file on
// another device can be copied device to device, the new entry is filled
// from it (e.src, pinned until the load ends). It returns the evicted
// regions for the caller to free after unlocking. Cache.mu must be held.
func (c *Cache) startLocked(rel string, o *opened, w *waiter, want *slot, at uint64, yield bool) (*entry, []gpu.Region, error) {
	id := o.id
	best := want
	if best == nil {
		room := int64(-1)
		for _, s := range c.slots {
			if eb, _ := s.evictableLocked(); s.capacity-s.used+eb > room {
				best, room = s, s.capacity-s.used+eb
			}
		}
	}
	need := best.need(id.size, int64(c.opts.ChunkSize))
	fds := best.dev.HeldDescriptors(id.size)
	if need > best.capacity {
		c.stats.tooLarge.Add(1)
		return nil, nil, errTooLarge(rel, need, best.capacity)
	}
	if fds > c.fdBudget {
		c.stats.tooLarge.Add(1)
		return nil, nil, errTooManyFDs(rel, fds, c.fdBudget)
	}
	regions, ok := c.admitLocked(w, best, need, fds)
	if !ok {
		return nil, regions, errNoSpace(rel, need)
	}
	c.stats.misses.Add(1)
	e := &entry{
		rel: rel, id: id, fid: o.fid, events: o.events, slot: best, gen: c.genLocked(rel, id),
		done: make(chan struct{}), state: stLoading, reserved: need, fds: fds, lastUse: at,
	}
	if yield {
		// Its tasks yield to demand loads, and a new reader through the
		// mount cancels it (readers.go).
		e.yielding, e.ra = true, &raLoad{gentle: true}
		e.ra.ctx, e.ra.cancel = context.WithCancel(c.ctx)
		e.ra.low.Store(true)
	}
	if src := c.sourceLocked(rel, o, best); src != nil {
		e.src = src
		src.pins++
		c.usedLocked(src, at) // a demand depends on it: promoted if read-ahead
		if !yield {
			src.keepLocked() // nor cancelled for a reader
		}
	}
	c.attachLocked(e)
	c.indexLocked(e)
	c.emitLocked(e.eventLocked(stLoading, ""))
	return e, regions, nil
}

// load fills e from f (or from its source replica) and publishes the
// result.
func (c *Cache) load(e *entry, f *os.File) {
	defer c.wg.Done()
	defer f.Close()
	start := time.Now()
	path, note, region, err := c.loadInto(e, f)
	if err == nil {
		if now, _, ferr := fileIdentity(f); ferr != nil || now != e.id {
			err = fmt.Errorf("its attributes changed: %w", errFileChanged)
		}
	}
	if err == nil {
		err = region.Seal()
	}
	dur := time.Since(start)
	c.publish(e, region, path, note, err, dur)
}

// loadInto allocates e's region and fills it: device to device from e's
// source replica when it has one and that ends resident, otherwise from
// f, after waiting out the racy window where the file's filesystem raises
// no change events (racy.go).
func (c *Cache) loadInto(e *entry, f *os.File) (path, note string, region gpu.Region, err error) {
	if e.src != nil {
		if region, err = c.alloc(e); err != nil {
			c.unpin(e.src)
			return "", "", nil, err
		}
		var done bool
		if path, note, done, err = c.fillFromPeer(e, region); done {
			return path, note, region, err
		}
	}
	if err = c.waitRacy(e); err == nil && region == nil {
		region, err = c.alloc(e)
	}
	if err != nil {
		return "", note, region, err
	}
	p, n, err := c.fill(e, f, region)
	return p, joinNote(note, n), region, err
}

// alloc allocates e's region. When the device is out of memory (other
// processes use it too), it evicts unleased entries of e's slot one by one
// and tries again; a read-ahead load evicts nothing for it and fails.
func (c *Cache) alloc(e *entry) (gpu.Region, error) {
	for {
		r, err := e.slot.dev.Alloc(e.id.size)
		if err == nil || !errors.Is(err, gpu.ErrOutOfMemory) {
			return r, err
		}
		c.lock()
		if e.readahead {
			c.unlock()
			return nil, err
		}
		var victim *entry
		for el := e.slot.lru.Back(); el != nil && victim == nil; el = el.Prev() {
			if v := el.Value.(*entry); !v.heldLocked() {
				victim = v
			}
		}
		var vr gpu.Region
		if victim != nil {
			vr = c.dropLocked(victim, "evicted: the device is out of memory")
			c.stats.evictions.Add(1)
			victim.slot.evictions.Add(1)
		}
		c.unlockFree(vr)
		if victim == nil {
			return nil, err
		}
	}
}

// fill loads f into region by the path the options and the platform allow.
// It returns the path taken and, when that is not cuFile although cuFile
// exists, why.
func (c *Cache) fill(e *entry, f *os.File, region gpu.Region) (path, note string, err error) {
	return c.fillSpan(e, f, region, span{0, e.id.size})
}

// span is a byte range of a file: [off, end).
type span struct{ off, end int64 }

// fillSpan is fill for the bytes of sp only (a share of a split ingest,
// peers.go).
func (c *Cache) fillSpan(e *entry, f *os.File, region gpu.Region, sp span) (path, note string, err error) {
	dev := e.slot.dev
	posix := PathPOSIX
	if dev.Kind() == gpu.KindHost {
		posix = PathHost
	}
	cf, why := dev.CuFile()
	switch {
	case c.io.CompatMode == CompatOn:
		note = "io.compat_mode is on"
	case cf == nil && c.io.CompatMode == CompatOff:
		return PathCuFile, "", fmt.Errorf("io.compat_mode is off and cuFile is unavailable: %s", why)
	case cf == nil:
		note = "cuFile unavailable: " + why
	case c.io.CompatMode == CompatAuto && e.id.size < int64(c.io.GDSThreshold):
		note = fmt.Sprintf("smaller than io.gds_threshold (%s)", c.io.GDSThreshold)
	case c.io.CompatMode == CompatAuto && cf.Mode() != "gds":
		// cuFile's compat mode is POSIX reads through its own bounce
		// buffers, slower than the POSIX path's pinned bounce buffers
		// (`gdsfs bench loader` shows both). Without GPUDirect Storage
		// proper, the POSIX path.
		c.stats.cufileFallbacks.Add(1)
		note = "cuFile runs only in its compat mode here (no GPUDirect Storage: nvidia-fs not in use); the POSIX path is faster"
	default:
		done, cfNote, err := c.fillCuFile(e, f, region, cf, sp)
		if done || err != nil {
			return PathCuFile, cfNote, err
		}
		note = cfNote
	}
	j := &job{rel: e.rel, region: region, start: sp.off, size: sp.end, f: f, ra: e.ra}
	if c.wantDirect(f, e.id.size) {
		df, derr := c.openDirect(e)
		switch {
		case errors.Is(derr, errFileChanged):
			return posix, note, derr
		case derr == nil:
			defer df.Close()
			j.f, j.direct = df, true
			note = joinNote(note, "read with O_DIRECT")
		default:
			note = joinNote(note, "O_DIRECT refused, buffered reads: "+derr.Error())
		}
	}
	if !j.direct {
		// Parallel tasks on one descriptor defeat the kernel's sequential
		// read-ahead; this starts a read-ahead at the span's start. The
		// kernel caps it at the device's read-ahead window
		// (force_page_cache_ra: max of io_pages and ra_pages), so it does
		// not read the whole span ahead.
		unix.Fadvise(int(f.Fd()), sp.off, sp.end-sp.off, unix.FADV_WILLNEED)
	}
	return posix, note, e.slot.loader.run(j)
}

// fillCuFile loads e with cuFile when it registers the file. In gds mode
// cuFile gets an O_DIRECT descriptor (GPUDirect Storage proper reads only
// through one; KvikIO's FileHandle keeps the same pair), checked to name
// the inode f names. In compat mode cuFile reads with POSIX calls on the
// descriptor it is given, so it gets the O_DIRECT one where io.direct_io
// wants O_DIRECT (on, or auto and the file mostly out of the page cache)
// and the buffered f otherwise, as KvikIO's compat mode reads through the
// page cache. Where the filesystem refuses O_DIRECT, f. done is false when
// registration was refused and the POSIX path should run; note then says
// why.
func (c *Cache) fillCuFile(e *entry, f *os.File, region gpu.Region, cf gpu.CuFile, sp span) (done bool, note string, err error) {
	reg := f
	if cf.Mode() == "gds" || c.wantDirect(f, e.id.size) {
		df, derr := c.openDirect(e)
		switch {
		case errors.Is(derr, errFileChanged):
			return true, "", derr
		case derr == nil:
			defer df.Close()
			reg = df
			note = "read with O_DIRECT"
		default:
			note = "O_DIRECT refused, cuFile given the buffered descriptor: " + derr.Error()
		}
	}
	h, rerr := cf.Register(int(reg.Fd()))
	if rerr == nil {
		defer h.Close()
		return true, note, e.slot.loader.run(&job{rel: e.rel, region: region, start: sp.off, size: sp.end, cf: h, ra: e.ra})
	}
	if c.io.CompatMode == CompatOff {
		return true, "", fmt.Errorf("io.compat_mode is off: %w", rerr)
	}
	c.stats.cufileFallbacks.Add(1)
	c.stats.setCuFileError(rerr.Error())
	return false, rerr.Error(), nil
}

// openDirect opens e's file again with O_DIRECT. Opened again by path, it
// must still be the inode e was opened as: otherwise the path names a new
// file now, and the load must start over (errFileChanged).
func (c *Cache) openDirect(e *entry) (*os.File, error) {
	if c.hooks.directOpen != nil {
		c.hooks.directOpen(e.rel)
	}
	df, st, err := c.openRegular(e.rel, syscall.O_DIRECT)
	if err != nil {
		return nil, err
	}
	if st.Dev != e.id.dev || st.Ino != e.id.ino {
		df.Close()
		return nil, fmt.Errorf("the path names another file than the one opened: %w", errFileChanged)
	}
	return df, nil
}

// wantDirect says whether to read with O_DIRECT: io.direct_io on, or auto
// and most of a sample of the file's pages are not in the page cache (cold
// data: reading it through the cache would only evict others).
func (c *Cache) wantDirect(f *os.File, size int64) bool {
	switch c.io.DirectIO {
	case DirectOn:
		return true
	case DirectOff:
		return false
	}
	return size >= 1<<20 && residentShare(f, size) < 0.5
}

// residentShare samples 64 pages of f with mincore and returns the share
// found in the page cache (1 when it cannot tell).
func residentShare(f *os.File, size int64) float64 {
	m, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return 1
	}
	defer unix.Munmap(m)
	const samples = 64
	page := int64(os.Getpagesize())
	vec := make([]byte, 1)
	in := 0
	for k := int64(0); k < samples; k++ {
		off := (size - 1) * k / (samples - 1) / page * page
		_, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[off])), 1, uintptr(unsafe.Pointer(&vec[0])))
		if errno == 0 && vec[0]&1 != 0 {
			in++
		}
	}
	return float64(in) / samples
}

func joinNote(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}
