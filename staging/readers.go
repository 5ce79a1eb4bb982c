package staging

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"
	"unsafe"

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

// readers is what the cache knows of one file's opens through the mount.
// Guarded by Cache.mu.
type readers struct {
	opens    int
	deferred bool        // staging waits for the last close
	timer    *time.Timer // staging.defer_limit
	pids     []uint32    // the processes that opened it (maxReaderPids at most)
}

// maxReaderPids bounds the processes remembered per file.
const maxReaderPids = 16

// openedDeferred counts an open of rel by pid (0: unknown) and defers its
// staging.
func (c *Cache) openedDeferred(rel string, pid uint32) {
	c.mu.Lock()
	defer c.mu.Unlock()
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
	if pid != 0 && len(r.pids) < maxReaderPids && !slices.Contains(r.pids, pid) {
		r.pids = append(r.pids, pid)
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
	if s := c.settling[rel]; s != nil {
		close(s.stop) // staged after this reader closes it
		delete(c.settling, rel)
	}
	for _, e := range c.replicasLocked(rel) {
		if e.yielding && e.state == StateLoading {
			e.yielding, e.yielded = false, true
			e.ra.cancel()
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
		e.ra.low.Store(false)
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
// after the last, a staging deferred by Opened is queued. It never blocks.
func (c *Cache) Closed(rel string) {
	c.mu.Lock()
	r := c.readers[rel]
	if r == nil {
		c.mu.Unlock()
		return
	}
	r.opens--
	if r.opens > 0 {
		c.mu.Unlock()
		return
	}
	delete(c.readers, rel)
	if r.timer != nil {
		r.timer.Stop()
	}
	c.mu.Unlock()
	if r.deferred {
		c.settleThenStage(rel, r.pids)
	}
}

// deferLimit stages rel, still open after staging.defer_limit.
func (c *Cache) deferLimit(rel string, r *readers) {
	c.mu.Lock()
	current := c.readers[rel] == r
	deferred := current && r.deferred
	if current {
		r.deferred, r.timer = false, nil
	}
	c.mu.Unlock()
	if deferred {
		c.Prefetch(rel)
	}
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
// after the last close waits while a process that opened the file through
// the mount still maps it (its /proc/PID/maps names the file; checked for
// files of settleMapMin bytes or more, where a staging beside the reader
// costs it most), and while the file's page cache grows (a reader the
// daemon cannot name). It starts once neither holds: at once for a file
// wholly in the page cache and mapped by none of them, else once the page
// cache has not grown for settleQuiet checks settleEvery apart; or after
// staging.defer_limit. A reader opening the file again meanwhile ends the
// wait (its own close starts another). Counted as mapped_read_waits.
const (
	settleEvery  = 250 * time.Millisecond
	settleQuiet  = 2
	settleMapMin = 64 << 20
)

// settling is one such wait.
type settling struct{ stop chan struct{} }

// settleThenStage queues the staging after rel's last close now if its
// page cache is whole (or cannot be read) and none of pids maps it, else
// once that holds or the page cache stops growing (a goroutine waits).
func (c *Cache) settleThenStage(rel string, pids []uint32) {
	cached, whole, mapped := c.readerState(rel, pids)
	if whole && !mapped {
		c.queueLocking(prefetchReq{rel: rel, afterRead: true})
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	if old := c.settling[rel]; old != nil {
		close(old.stop)
	}
	s := &settling{stop: make(chan struct{})}
	c.settling[rel] = s
	c.stats.mappedReadWaits.Add(1)
	c.wg.Add(1)
	go c.settle(rel, s, pids, cached)
}

func (c *Cache) settle(rel string, s *settling, pids []uint32, last int64) {
	defer c.wg.Done()
	var limit <-chan time.Time
	if c.opts.DeferLimit > 0 {
		t := time.NewTimer(c.opts.DeferLimit)
		defer t.Stop()
		limit = t.C
	}
	for quiet := 0; quiet < settleQuiet; {
		select {
		case <-s.stop:
			return
		case <-c.ctx.Done():
			return
		case <-limit:
			quiet = settleQuiet
		case <-c.settleTick(rel):
			n, whole, mapped := c.readerState(rel, pids)
			switch {
			case mapped:
				quiet = 0
			case whole:
				quiet = settleQuiet
			case n > last:
				quiet = 0
			default:
				quiet++
			}
			last = n
		}
	}
	c.mu.Lock()
	mine := c.settling[rel] == s
	if mine {
		delete(c.settling, rel)
	}
	c.mu.Unlock()
	if mine {
		c.queueLocking(prefetchReq{rel: rel, afterRead: true})
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
// cannot be opened, and the staging will say why), and whether one of
// pids maps it (for a file of settleMapMin bytes or more).
func (c *Cache) readerState(rel string, pids []uint32) (cached int64, whole, mapped bool) {
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
		mapped = mappedBy(pids, st.Dev, st.Ino)
	}
	return cached, whole, mapped
}

// mappedBy reports whether one of pids maps the file dev:ino, as its
// /proc/PID/maps says (a process that exited, or that this daemon cannot
// see, maps nothing).
func mappedBy(pids []uint32, dev, ino uint64) bool {
	want := fmt.Sprintf("%02x:%02x %d ", unix.Major(dev), unix.Minor(dev), ino)
	for _, pid := range pids {
		f, err := os.Open(fmt.Sprintf("/proc/%d/maps", pid))
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		found := false
		for sc.Scan() {
			// address perms offset dev inode path
			line := sc.Text()
			if i := strings.Index(line, want); i > 0 && fieldStart(line, i) == 3 {
				found = true
				break
			}
		}
		f.Close()
		if found {
			return true
		}
	}
	return false
}

// fieldStart is the index of the space-separated field starting at byte i
// of line (-1: i does not start a field).
func fieldStart(line string, i int) int {
	if i > 0 && line[i-1] != ' ' {
		return -1
	}
	return len(strings.Fields(line[:i]))
}

// pageCacheOf counts f's pages in the page cache with cachestat(2)
// (Linux 6.5), else mincore(2) over a mapping of the file.
func pageCacheOf(f *os.File, size int64) (cached int64, whole bool) {
	page := int64(os.Getpagesize())
	pages := (size + page - 1) / page
	if pages == 0 {
		return 0, true
	}
	var cs unix.Cachestat_t
	err := unix.Cachestat(uint(f.Fd()), &unix.CachestatRange{Off: 0, Len: uint64(size)}, &cs, 0)
	if err == nil {
		return int64(cs.Cache), int64(cs.Cache) >= pages
	}
	return mincorePages(f, size)
}

// mincorePages counts f's pages in the page cache with mincore(2); whole
// is true too where it cannot tell.
func mincorePages(f *os.File, size int64) (cached int64, whole bool) {
	page := int64(os.Getpagesize())
	pages := (size + page - 1) / page
	if pages == 0 {
		return 0, true
	}
	m, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return 0, true
	}
	defer unix.Munmap(m)
	vec := make([]byte, pages)
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		return 0, true
	}
	for _, v := range vec {
		cached += int64(v & 1)
	}
	return cached, cached >= pages
}
