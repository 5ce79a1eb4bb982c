package staging

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Staging waits for the readers. A file opened for reading through the
// mount is staged once the last such open is closed, not while it is read:
// an unmodified loader reading the file through the mount gets the disk
// and the page cache to itself, and the staging that follows reads from
// the page cache it warmed. A lease asks now and is served now; a
// prefetch of any file (.gdsfs/prefetch, warmup, read-ahead of the next
// files) is not held back. A file held open longer than
// staging.defer_limit is staged then (its reader may be done with it
// without closing it). Off: staging.defer_while_read=false.

// Reader is what the mount knows of an open for reading: the thread that
// opened the file (the FUSE request's, in the daemon's PID namespace; 0
// when the kernel could not say), the device and inode number a mapping
// of the file made through the mount shows in /proc/PID/maps, and the
// file's size.
type Reader struct {
	PID      uint32
	Dev, Ino uint64
	Size     int64
}

// readers is what the cache knows of one file's opens through the mount.
// Guarded by Cache.mu.
type readers struct {
	opens    int
	deferred bool        // staging waits for the last close
	timer    *time.Timer // staging.defer_limit
	openers  []opener    // the latest processes that opened it (files of settleMapMin bytes or more)
}

// opener is a process that opened a file through the mount, and the
// device and inode its /proc/PID/maps shows for a mapping made through
// the mount.
type opener struct {
	pid      uint32 // process (thread group) ID
	dev, ino uint64
}

// maxOpeners bounds the processes remembered per file: the latest.
const maxOpeners = 4

// mergeOpeners adds add to list, keeping the latest maxOpeners distinct
// processes.
func mergeOpeners(list []opener, add ...opener) []opener {
	for _, o := range add {
		for i, x := range list {
			if x.pid == o.pid {
				list = append(list[:i:i], list[i+1:]...)
				break
			}
		}
		list = append(list, o)
	}
	if len(list) > maxOpeners {
		list = append([]opener(nil), list[len(list)-maxOpeners:]...)
	}
	return list
}

// openedDeferred counts an open of rel by r and defers its staging.
func (c *Cache) openedDeferred(rel string, rd Reader) {
	var o opener
	if rd.PID != 0 && rd.Size >= c.settleMapMin {
		o = opener{pid: processOf(rd.PID), dev: rd.Dev, ino: rd.Ino}
	}
	c.lock()
	defer c.unlock()
	if c.closed {
		return
	}
	r := c.readers[rel]
	if r == nil {
		r = &readers{}
		c.readers[rel] = r
	}
	r.opens++
	r.deferred = true
	if o.pid != 0 {
		r.openers = mergeOpeners(r.openers, o)
	}
	c.stats.deferredOpens.Add(1)
	if r.timer == nil && c.opts.DeferLimit > 0 {
		r.timer = time.AfterFunc(c.opts.DeferLimit, func() { c.deferLimit(rel, r) })
	}
	// A staging that followed an earlier reader's close and is still
	// loading yields to this one: left running, it would read the disk
	// alongside the reader (a loader that opens a file to read its header,
	// closes it, and opens it again to read the rest). Staged again after
	// this reader closes it.
	if s := c.endSettlingLocked(rel); s != nil { // staged after this reader closes it
		r.openers = mergeOpeners(append([]opener(nil), s.openers...), r.openers...) // they may still map it; the newest kept last
	}
	for _, e := range c.replicasLocked(rel) {
		if e.yielding && e.state == stLoading {
			e.yielding, e.yielded = false, true
			e.ra.Cancel()
			c.stats.yielded.Add(1)
			c.dropLocked(e, "yielded to a reader") // loading: its region is freed by the load's end
		}
	}
}

// keepLocked makes a yielding load an ordinary one, because a demand
// depends on it: a reader no longer cancels it, and its tasks no longer
// give way. Cache.mu must be held.
func (e *entry) keepLocked() {
	if e.yielding {
		e.yielding = false
		e.ra.Low.Store(false)
		if e.slot != nil && e.slot.loader != nil {
			e.slot.loader.Signal() // its tasks are no longer capped (staging/loader)
		}
	}
}

// stageYielding stages rel after its readers closed it: a reader opening
// it again through the mount meanwhile cancels the load (errYielded).
func (c *Cache) stageYielding(ctx context.Context, rel string, at uint64) error {
	e, err := c.ensure(ctx, rel, place{yield: true}, false, at)
	if err != nil {
		return err
	}
	c.unpin(e)
	return nil
}

// Closed tells the cache that one open of rel through the mount ended;
// after the last, a staging deferred by Opened follows (once the reader
// is done with the file: settle). It never blocks.
func (c *Cache) Closed(rel string) {
	c.lock()
	defer c.unlock()
	r := c.readers[rel]
	if r == nil {
		return
	}
	r.opens--
	if r.opens > 0 {
		return
	}
	delete(c.readers, rel)
	if r.timer != nil {
		r.timer.Stop()
	}
	if !r.deferred || c.closed {
		return
	}
	if len(c.replicasLocked(rel)) > 0 {
		// Staged or loading already: the staging after the read is a hit
		// or joins that load, nothing to wait for.
		c.queuePrefetchLocked(rel, nil, true)
		return
	}
	s := &settling{stop: make(chan struct{}), openers: r.openers}
	c.settling[rel] = s
	c.wg.Add(1)
	go c.settle(rel, s)
}

// deferLimit stages rel, still open after staging.defer_limit.
func (c *Cache) deferLimit(rel string, r *readers) {
	c.lock()
	current := c.readers[rel] == r
	deferred := current && r.deferred
	if current {
		r.deferred, r.timer = false, nil
	}
	c.unlock()
	if deferred {
		c.Prefetch(rel)
	}
}

// cancelAfterReadLocked cancels the staging deferred for rel's readers:
// the one their last close starts (r.deferred) and a settling wait
// already started. It reports whether there was one. Cache.mu must be
// held (an explicit evict).
func (c *Cache) cancelAfterReadLocked(rel string) bool {
	cancelled := false
	if r := c.readers[rel]; r != nil && r.deferred {
		r.deferred = false
		if r.timer != nil {
			r.timer.Stop()
			r.timer = nil
		}
		cancelled = true
	}
	if c.endSettlingLocked(rel) != nil {
		cancelled = true
	}
	return cancelled
}

// endSettlingLocked ends rel's settling wait, if one runs, and returns
// it; Cache.mu must be held.
func (c *Cache) endSettlingLocked(rel string) *settling {
	s := c.settling[rel]
	if s != nil {
		close(s.stop)
		delete(c.settling, rel)
	}
	return s
}

// stopReadersLocked stops the timers and the settling waits; Cache.mu must
// be held (Close).
func (c *Cache) stopReadersLocked() {
	for _, r := range c.readers {
		if r.timer != nil {
			r.timer.Stop()
		}
	}
	c.readers = map[string]*readers{}
	for _, s := range c.settling {
		close(s.stop)
	}
	c.settling = map[string]*settling{}
}

// A reader may go on reading a file after its last close: through a
// mapping it made before closing (safetensors 0.8 opens the file, maps it,
// closes it, then reads the whole mapping and copies it to the device).
// With passthrough the daemon sees none of those reads. So the staging
// after the last close waits while one of the latest processes that opened
// the file through the mount still maps it (its /proc/PID/maps names the
// file; checked for files of settleMapMin bytes or more, where a staging
// beside the reader costs it most), and while the file's page cache grows
// (a reader the daemon cannot name; cachestat(2), Linux 6.5: not waited
// for without it). It starts once neither holds: at the first check for a
// file wholly in the page cache and mapped by none of them, else once the
// page cache has not grown for settleQuiet checks settleEvery apart; or
// staging.defer_limit after the last close. A reader opening the file
// again ends the wait (its own last close starts another, still watching
// the processes this one watched). A file staged or loading already is
// not waited for. Waits are counted as mapped_read_waits.
const (
	settleEvery  = 250 * time.Millisecond
	settleQuiet  = 2
	settleMapMin = 64 << 20
	// mapsLimit bounds the bytes of one /proc/PID/maps read per check (a
	// process can have tens of thousands of mappings).
	mapsLimit = 2 << 20
	// settleChecks bounds the checks running at once.
	settleChecks = 2
)

// settling is one such wait.
type settling struct {
	stop    chan struct{}
	openers []opener
}

// settle waits until rel's reader is done with it (above), then queues its
// staging after the read.
func (c *Cache) settle(rel string, s *settling) {
	defer c.wg.Done()
	var limit <-chan time.Time
	if c.opts.DeferLimit > 0 {
		t := time.NewTimer(c.opts.DeferLimit)
		defer t.Stop()
		limit = t.C
	}
	last, whole, mapped := c.readerState(rel, s.openers)
	if !whole || mapped {
		c.stats.mappedReadWaits.Add(1)
	}
	for quiet := 0; (!whole || mapped) && quiet < settleQuiet; {
		select {
		case <-s.stop:
			return
		case <-c.ctx.Done():
			return
		case <-limit:
			whole, mapped = true, false
		case <-c.settleTick(rel):
			var n int64
			n, whole, mapped = c.readerState(rel, s.openers)
			switch {
			case mapped || n > last:
				quiet = 0
			default:
				quiet++
			}
			last = n
		}
	}
	c.lock()
	defer c.unlock()
	if c.settling[rel] == s {
		delete(c.settling, rel)
		c.queuePrefetchLocked(rel, nil, true)
	}
}

func (c *Cache) settleTick(rel string) <-chan time.Time {
	if c.hooks.settleTick != nil {
		return c.hooks.settleTick(rel)
	}
	return time.After(settleEvery)
}

// readerState says how many of rel's pages are in the page cache,
// whether that is all of them (true too where it cannot tell: the file
// cannot be opened, and the staging will say why; or no cachestat), and
// whether one of openers maps it (for a file of settleMapMin bytes or
// more).
func (c *Cache) readerState(rel string, openers []opener) (cached int64, whole, mapped bool) {
	c.settleSem <- struct{}{}
	defer func() { <-c.settleSem }()
	f, st, err := c.openRegular(rel, 0)
	if err != nil {
		return 0, true, false
	}
	defer f.Close()
	if c.hooks.pageCache != nil {
		cached, whole = c.hooks.pageCache(rel)
	} else {
		cached, whole = pageCacheOf(f, st.Size)
	}
	if st.Size >= c.settleMapMin {
		mapped = mappedBy(openers, st.Dev, st.Ino)
	}
	return cached, whole, mapped
}

// mappedBy reports whether one of openers maps the file, as its
// /proc/PID/maps says: by the device and inode it showed through the
// mount, or SOURCE's (dev, ino: a mapping of the backing file itself). A
// process that exited, or that this daemon cannot see, maps nothing; so
// does a mapping past the first mapsLimit bytes of its maps.
func mappedBy(openers []opener, dev, ino uint64) bool {
	src := mapsID(dev, ino)
	for _, o := range openers {
		f, err := os.Open("/proc/" + strconv.FormatUint(uint64(o.pid), 10) + "/maps")
		if err != nil {
			continue
		}
		mnt := mapsID(o.dev, o.ino)
		sc := bufio.NewScanner(io.LimitReader(f, mapsLimit))
		sc.Buffer(make([]byte, 0, 64<<10), 64<<10)
		found := false
		for sc.Scan() && !found {
			// address perms offset dev inode path
			line := sc.Bytes()
			found = fieldIs(line, 3, src) || o.dev != 0 && fieldIs(line, 3, mnt)
		}
		f.Close()
		if found {
			return true
		}
	}
	return false
}

// mapsID is "DEV INODE " as /proc/PID/maps spells a mapping's file.
func mapsID(dev, ino uint64) []byte {
	return fmt.Appendf(nil, "%02x:%02x %d ", unix.Major(dev), unix.Minor(dev), ino)
}

// fieldIs reports whether line's space-separated fields from the n-th on
// start with want (its last byte a space).
func fieldIs(line []byte, n int, want []byte) bool {
	for range n {
		i := bytes.IndexByte(line, ' ')
		if i < 0 {
			return false
		}
		line = bytes.TrimLeft(line[i:], " ")
	}
	return bytes.HasPrefix(line, want)
}

// processOf is the process (thread group) of thread tid, which the FUSE
// request names; 0 when it cannot be read (the thread is gone, or lives
// in another PID namespace).
func processOf(tid uint32) uint32 {
	b, err := os.ReadFile("/proc/" + strconv.FormatUint(uint64(tid), 10) + "/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Tgid:"); ok {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 32)
			if err != nil {
				return 0
			}
			return uint32(n)
		}
	}
	return 0
}

// pageCacheOf counts f's pages in the page cache with cachestat(2) (Linux
// 6.5); whole is true too where it cannot tell.
func pageCacheOf(f *os.File, size int64) (cached int64, whole bool) {
	page := int64(os.Getpagesize())
	pages := (size + page - 1) / page
	if pages == 0 {
		return 0, true
	}
	var cs unix.Cachestat_t
	if err := unix.Cachestat(uint(f.Fd()), &unix.CachestatRange{Off: 0, Len: uint64(size)}, &cs, 0); err != nil {
		return 0, true
	}
	return int64(cs.Cache), int64(cs.Cache) >= pages
}
