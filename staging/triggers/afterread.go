package triggers

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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
//
// The staging after a read is queued (AfterReadCore.StageAfterRead) and
// yields to a reader: a reader opening the file again through the mount
// cancels it while it loads (AfterReadCore.CancelYielding), and one that
// has the file open when it would start holds it back (Reading, asked
// under Cache.mu).

// AfterReadCore is the cache's API for the staging after reads (the
// cache, *staging.Cache, implements it). None of it may be called with
// AfterRead.mu held.
type AfterReadCore interface {
	// Go runs f on a goroutine the cache waits for when it closes;
	// false (f not run): the cache is closed.
	Go(f func()) bool
	// StageAfterRead queues a staging of rel after a read: its load
	// yields to demand loads, and to a reader opening rel through the
	// mount. false: dropped (queue full, cache closed).
	StageAfterRead(rel string) bool
	// CancelYielding cancels rel's stagings after a read still loading
	// that no demand joined: a reader opened rel again.
	CancelYielding(rel string)
	// Staged says whether rel has an entry, loading or resident.
	Staged(rel string) bool
	// Done is closed when the cache's context ends (the context the cache
	// was made with is done, or the cache closes): the settling waits end
	// there, staging nothing.
	Done() <-chan struct{}
	// Prefetch queues rel for staging (staging.defer_limit).
	Prefetch(rel string) bool
	// OpenSource opens rel beneath SOURCE as the daemon, a regular file
	// only, never blocking.
	OpenSource(rel string) (*os.File, *unix.Stat_t, error)
}

// Reader is what the mount knows of an open for reading (staging.Reader):
// the thread that opened the file (0 when the kernel could not say), the
// device and inode number a mapping of the file made through the mount
// shows in /proc/PID/maps, and the file's size.
type Reader struct {
	PID      uint32
	Dev, Ino uint64
	Size     int64
}

// AfterReadOptions configure an AfterRead.
type AfterReadOptions struct {
	// DeferLimit stages a file held open this long (staging.defer_limit);
	// 0: never.
	DeferLimit time.Duration
	// MapMin: files this large are checked for their readers' mappings
	// after their last close (SettleMapMin).
	MapMin int64

	// Tests' hooks; nil in production.
	// PageCache counts rel's pages in the page cache, and says whether
	// all are (instead of cachestat).
	PageCache func(rel string) (int64, bool)
	// SettleTick is the next check of a settling file's page cache
	// (instead of a timer of settleEvery).
	SettleTick func(rel string) <-chan time.Time
	// AfterFunc starts staging.defer_limit's timer (instead of
	// time.AfterFunc); it returns what stops it. It is called with
	// AfterRead.mu held: it must not block, nor call the AfterRead.
	AfterFunc func(rel string, d time.Duration, f func()) (stop func() bool)
}

// AfterRead is the staging after plain reads through the mount.
type AfterRead struct {
	// Constant once Attach returns.
	opts AfterReadOptions
	core AfterReadCore
	sem  chan struct{} // bounds the settling checks running at once
	done chan struct{} // closed by Stop: the settling waits end (as they do at core.Done)

	deferredOpens, mappedReadWaits atomic.Uint64

	// Mutable, guarded by mu.
	mu       sync.Mutex
	readers  map[string]*readers  // opens through the mount
	settling map[string]*settling // closed by their readers, still read
	stopped  bool
}

// NewAfterRead makes the staging after reads; the cache attaches it.
func NewAfterRead(opts AfterReadOptions) *AfterRead {
	return &AfterRead{
		opts: opts, sem: make(chan struct{}, settleChecks), done: make(chan struct{}),
		readers: map[string]*readers{}, settling: map[string]*settling{},
	}
}

// Attach gives it the cache's API; the cache calls it once, first.
func (a *AfterRead) Attach(core AfterReadCore) { a.core = core }

// readers is what is known of one file's opens through the mount.
type readers struct {
	opens    int
	deferred bool        // staging waits for the last close
	stop     func() bool // staging.defer_limit's timer
	openers  []opener    // the latest processes that opened it (files of MapMin bytes or more)
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

// Opened counts an open of rel by rd and defers its staging to the last
// close. It never blocks.
func (a *AfterRead) Opened(rel string, rd Reader) {
	var o opener
	if rd.PID != 0 && rd.Size >= a.opts.MapMin {
		o = opener{pid: processOf(rd.PID), dev: rd.Dev, ino: rd.Ino}
	}
	a.mu.Lock()
	if a.stopped {
		a.mu.Unlock()
		return
	}
	r := a.readers[rel]
	if r == nil {
		r = &readers{}
		a.readers[rel] = r
	}
	r.opens++
	r.deferred = true
	if o.pid != 0 {
		r.openers = mergeOpeners(r.openers, o)
	}
	a.deferredOpens.Add(1)
	if r.stop == nil && a.opts.DeferLimit > 0 {
		r.stop = a.afterFunc(rel, func() { a.deferLimit(rel, r) })
	}
	if s := a.endSettlingLocked(rel); s != nil { // staged after this reader closes it
		r.openers = mergeOpeners(append([]opener(nil), s.openers...), r.openers...) // they may still map it; the newest kept last
	}
	a.mu.Unlock()
	// A staging that followed an earlier reader's close and is still
	// loading yields to this one: left running, it would read the disk
	// alongside the reader (a loader that opens a file to read its header,
	// closes it, and opens it again to read the rest). Staged again after
	// this reader closes it. One that starts from now on finds this
	// reader (Reading) and yields at once.
	a.core.CancelYielding(rel)
}

// afterFunc starts staging.defer_limit's timer for rel.
func (a *AfterRead) afterFunc(rel string, f func()) (stop func() bool) {
	if a.opts.AfterFunc != nil {
		return a.opts.AfterFunc(rel, a.opts.DeferLimit, f)
	}
	return time.AfterFunc(a.opts.DeferLimit, f).Stop
}

// Closed counts the end of one open of rel through the mount; after the
// last, the staging deferred by Opened follows (once the reader is done
// with the file: settle). It never blocks.
//
// The last close is counted down first, and the cache asked whether rel
// is staged after it (an entry made or dropped before the count down is
// seen, as when both were one step under Cache.mu). Until the answer
// comes, the last close is held as a settling wait not yet started: a
// reader opening rel again, an explicit evict or Stop meanwhile ends it
// as they end a settling wait, and it is checked for under mu before
// anything is staged or waited for.
func (a *AfterRead) Closed(rel string) {
	a.mu.Lock()
	r := a.readers[rel]
	if r == nil {
		a.mu.Unlock()
		return
	}
	r.opens--
	if r.opens > 0 {
		a.mu.Unlock()
		return
	}
	delete(a.readers, rel)
	if r.stop != nil {
		r.stop()
	}
	if !r.deferred || a.stopped {
		a.mu.Unlock()
		return
	}
	s := &settling{stop: make(chan struct{}), openers: r.openers}
	a.settling[rel] = s
	a.mu.Unlock()
	staged := a.core.Staged(rel) // the cache is never called with mu held
	a.mu.Lock()
	current := a.settling[rel] == s
	if current && staged {
		delete(a.settling, rel)
	}
	a.mu.Unlock()
	switch {
	case !current:
		// Ended meanwhile: a reader opened rel again (its own last close
		// stages it), or an evict or Stop cancelled it.
	case staged:
		// Staged or loading already: the staging after the read is a hit
		// or joins that load, nothing to wait for.
		a.core.StageAfterRead(rel)
	case !a.core.Go(func() { a.settle(rel, s) }):
		a.mu.Lock()
		if a.settling[rel] == s {
			delete(a.settling, rel)
		}
		a.mu.Unlock()
	}
}

// deferLimit stages rel, still open after staging.defer_limit.
func (a *AfterRead) deferLimit(rel string, r *readers) {
	a.mu.Lock()
	current := a.readers[rel] == r
	deferred := current && r.deferred
	if current {
		r.deferred, r.stop = false, nil
	}
	a.mu.Unlock()
	if deferred {
		a.core.Prefetch(rel)
	}
}

// Reading says whether a reader has rel open through the mount: a
// staging after a read about to start yields. Called under Cache.mu.
func (a *AfterRead) Reading(rel string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	r := a.readers[rel]
	return r != nil && r.opens > 0
}

// Deferred says whether rel's staging waits for its readers' last close.
// Called under Cache.mu.
func (a *AfterRead) Deferred(rel string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	r := a.readers[rel]
	return r != nil && r.deferred
}

// Cancel cancels the staging deferred for rel's readers: the one their
// last close starts and a settling wait already started. It reports
// whether there was one. Called under Cache.mu (an explicit evict).
func (a *AfterRead) Cancel(rel string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	cancelled := false
	if r := a.readers[rel]; r != nil && r.deferred {
		r.deferred = false
		if r.stop != nil {
			r.stop()
			r.stop = nil
		}
		cancelled = true
	}
	if a.endSettlingLocked(rel) != nil {
		cancelled = true
	}
	return cancelled
}

// Stop stops the timers and the settling waits, and forgets the readers;
// nothing is staged after it. Called under Cache.mu (Close).
func (a *AfterRead) Stop() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.stopped {
		return
	}
	a.stopped = true
	close(a.done)
	for _, r := range a.readers {
		if r.stop != nil {
			r.stop()
		}
	}
	a.readers = map[string]*readers{}
	for _, s := range a.settling {
		close(s.stop)
	}
	a.settling = map[string]*settling{}
}

// Open is the number of files open for reading through the mount now.
func (a *AfterRead) Open() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.readers)
}

// Settling is the number of settling waits running (a last close still
// asking the cache whether its file is staged counts as one).
func (a *AfterRead) Settling() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.settling)
}

// Counters are its counters by their stats.json keys: deferred_opens
// (opens whose staging waited for the readers) and mapped_read_waits
// (stagings after a last close that waited for a reader's mapping or the
// page cache). They continue across a hand-over.
func (a *AfterRead) Counters() map[string]*atomic.Uint64 {
	return map[string]*atomic.Uint64{"deferred_opens": &a.deferredOpens, "mapped_read_waits": &a.mappedReadWaits}
}

// endSettlingLocked ends rel's settling wait, if one runs, and returns
// it; a.mu must be held.
func (a *AfterRead) endSettlingLocked(rel string) *settling {
	s := a.settling[rel]
	if s != nil {
		close(s.stop)
		delete(a.settling, rel)
	}
	return s
}

// A reader may go on reading a file after its last close: through a
// mapping it made before closing (safetensors 0.8 opens the file, maps it,
// closes it, then reads the whole mapping and copies it to the device).
// With passthrough the daemon sees none of those reads. So the staging
// after the last close waits while one of the latest processes that opened
// the file through the mount still maps it (its /proc/PID/maps names the
// file; checked for files of SettleMapMin bytes or more, where a staging
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
	settleEvery = 250 * time.Millisecond
	settleQuiet = 2
	// SettleMapMin is the size from which a file's readers' mappings are
	// waited for (AfterReadOptions.MapMin).
	SettleMapMin = 64 << 20
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
func (a *AfterRead) settle(rel string, s *settling) {
	var limit <-chan time.Time
	if a.opts.DeferLimit > 0 {
		t := time.NewTimer(a.opts.DeferLimit)
		defer t.Stop()
		limit = t.C
	}
	last, whole, mapped := a.readerState(rel, s.openers)
	if !whole || mapped {
		a.mappedReadWaits.Add(1)
	}
	for quiet := 0; (!whole || mapped) && quiet < settleQuiet; {
		select {
		case <-s.stop:
			return
		case <-a.done:
			return
		case <-a.core.Done():
			return
		case <-limit:
			whole, mapped = true, false
		case <-a.settleTick(rel):
			var n int64
			n, whole, mapped = a.readerState(rel, s.openers)
			switch {
			case mapped || n > last:
				quiet = 0
			default:
				quiet++
			}
			last = n
		}
	}
	a.mu.Lock()
	current := a.settling[rel] == s
	if current {
		delete(a.settling, rel)
	}
	a.mu.Unlock()
	if current {
		a.core.StageAfterRead(rel)
	}
}

func (a *AfterRead) settleTick(rel string) <-chan time.Time {
	if a.opts.SettleTick != nil {
		return a.opts.SettleTick(rel)
	}
	return time.After(settleEvery)
}

// readerState says how many of rel's pages are in the page cache,
// whether that is all of them (true too where it cannot tell: the file
// cannot be opened, and the staging will say why; or no cachestat), and
// whether one of openers maps it (for a file of MapMin bytes or more).
func (a *AfterRead) readerState(rel string, openers []opener) (cached int64, whole, mapped bool) {
	a.sem <- struct{}{}
	defer func() { <-a.sem }()
	f, st, err := a.core.OpenSource(rel)
	if err != nil {
		return 0, true, false
	}
	defer f.Close()
	if a.opts.PageCache != nil {
		cached, whole = a.opts.PageCache(rel)
	} else {
		cached, whole = pageCacheOf(f, st.Size)
	}
	if st.Size >= a.opts.MapMin {
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
