package fs

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/staging/watch"
)

// Watcher is what fs needs from change detection (staging/watch).
type Watcher interface {
	// ProbeEntries marks f's filesystem and says whether its entry and
	// attribute changes are reported.
	ProbeEntries(f *os.File, dev uint64) (events bool, why string)
	Subscribe(watch.Subscriber)
	// Drain hands every event queued now to the subscribers.
	Drain()
}

// cachedTimeout is how long the kernel may keep entries and attributes of
// SOURCE's filesystem when its changes are reported: until told.
const cachedTimeout = 24 * time.Hour

// metaCache lets the kernel cache entries, attributes and directory
// listings of SOURCE's filesystem for long, and invalidates them when
// change detection reports a change. Events are queued by the watcher's
// subscriber and handled by run: a notification to the kernel may wait
// for a directory lock that a request in flight holds, so it is never
// sent from a request or from the watcher's reading lock.
type metaCache struct {
	on     bool   // SOURCE's filesystem reports changes; fixed at mount
	why    string // why not
	srv    *Server
	source *os.File // SOURCE, opened for reading: open_by_handle_at refuses O_PATH descriptors

	fsid [8]byte // SOURCE's filesystem's id, as events name it

	// mu and nodesMu are never held together.
	mu      sync.Mutex
	cond    *sync.Cond    // queued, handled or stop changed
	queue   []metaEvent   // guarded by mu
	lost    bool          // invalidate everything (events were lost, or the mount was adopted); guarded by mu
	lostWhy string        // why, with lost; guarded by mu
	unknown []uint64      // node ids the kernel may hold that no node answers for (a crash's lost journal records); guarded by mu
	queued  uint64        // changes queued so far (a lost counts one); guarded by mu
	handled uint64        // changes handled so far; guarded by mu
	stop    bool          // guarded by mu
	paused  bool          // the handler takes nothing (a hand-over in progress: pause); guarded by mu
	busy    bool          // the handler is telling the kernel; guarded by mu
	done    chan struct{} // closed when run returns; nil when it never ran
	// conn is the handler's own descriptor of the connection, which it
	// writes expiries to (expireEntry): go-fuse closes its own when it
	// stops serving, and the number may then name another file. -1: none
	// (the kernel cannot expire an entry: entries are dropped). Set
	// before run starts, closed (guarded by mu) after it returned.
	conn int

	// nodesMu serializes changes of nodes and guards keys. nodes is read
	// without it: the watcher's subscriber looks every event up there.
	nodesMu sync.Mutex
	nodes   sync.Map                    // watch.FID -> *gofs.Inode: the nodes the kernel may cache, by the FID events name their file with
	keys    map[*gofs.Inode][]watch.FID // each node's keys in nodes; guarded by nodesMu
	journal *nodeJournal                // nodes mirrored for a successor after a crash (journal.go); nil: none; guarded by nodesMu
}

// maxQueued bounds the queue: past it, everything is invalidated at once.
const maxQueued = 1 << 16

// probeMeta asks whether SOURCE's filesystem reports changes and, when it
// does, subscribes: changes from then on are queued. Called before the
// mount serves.
func (s *Server) probeMeta(w Watcher, journal bool) {
	m := &s.meta
	m.srv, m.keys = s, map[*gofs.Inode][]watch.FID{}
	m.cond = sync.NewCond(&m.mu)
	if w == nil {
		m.why = "no change detection"
		return
	}
	f, err := s.root.Open(".", unix.O_RDONLY|unix.O_DIRECTORY, 0, 0)
	if err != nil {
		m.why = err.Error()
		return
	}
	m.on, m.why = w.ProbeEntries(f, s.dev)
	if m.on {
		m.fsid, err = watch.FSID(int(f.Fd()))
		m.on, m.why = err == nil, fmt.Sprint(err)
	}
	if m.on && journal {
		if m.journal, err = newJournal(); err != nil {
			s.log.Warn("nodes are not journaled: after a crash, files open before it fail their next request", zap.Error(err))
		}
	}
	if m.on {
		m.source = f
		w.Subscribe(watch.Subscriber{Entries: m.enqueue, Lost: m.enqueueLost, Mounts: m.enqueueMount})
		return
	}
	f.Close()
	s.log.Info("the kernel caches entries and attributes for fuse.entry_timeout and fuse.attr_timeout",
		zap.String("reason", m.why))
}

// startMeta starts the handler of SOURCE's changes, when there are any.
// Called once the mount serves.
func (s *Server) startMeta() {
	m := &s.meta
	if !m.on {
		return
	}
	if id, err := watch.FileFID(int(m.source.Fd()), m.fsid); err == nil {
		m.add(id, s.tree.EmbeddedInode())
	}
	m.conn = -1
	if k := s.kernelInit(); k.Major == 7 && k.Minor >= 38 { // FUSE_EXPIRE_ONLY
		if fd, err := unix.FcntlInt(uintptr(s.fuseFd), unix.F_DUPFD_CLOEXEC, 0); err == nil {
			m.conn = fd
		}
	}
	m.done = make(chan struct{})
	go m.run()
}

// pause stops the handler telling the kernel anything, once what it is
// telling it now is told; changes queue meanwhile. A hand-over pauses it
// before it switches go-fuse's descriptor: a notification waits in the
// kernel for its directory's lock, which a request held until the
// successor serves may hold.
func (m *metaCache) pause() {
	m.mu.Lock()
	m.paused = true
	for m.busy && !m.stop {
		m.cond.Wait()
	}
	m.mu.Unlock()
}

// unpause undoes pause.
func (m *metaCache) unpause() {
	m.mu.Lock()
	m.paused = false
	m.cond.Broadcast()
	m.mu.Unlock()
}

// cached reports whether the kernel may cache the node id for long.
func (m *metaCache) cached(id fileID) bool { return m.on && id.dev == m.srv.dev }

// fid is the FID change events name the file fd refers to with, when the
// kernel may cache the node id for long; "" when it may not.
func (m *metaCache) fid(fd int, id fileID) watch.FID {
	if !m.cached(id) {
		return ""
	}
	fid, err := watch.FileFID(fd, m.fsid)
	if err != nil {
		return ""
	}
	return fid
}

// cachedMeta reports whether the kernel may cache n's entry, attributes
// and listing for long.
func (n *node) cachedMeta() bool {
	return n.srv.meta.on && (n.IsRoot() || n.fid != "")
}

// settle hands every change reported before it to the kernel.
func (s *Server) settle(w Watcher) {
	w.Drain()
	s.meta.settle()
}

// cacheEntry records n as the node of the file events name fid and lets
// the kernel cache its entry and attributes for long; with fid "", it
// does neither.
func (m *metaCache) cacheEntry(fid watch.FID, n *gofs.Inode, out *fuse.EntryOut) {
	if fid == "" || !m.on {
		return
	}
	m.add(fid, n)
	out.SetEntryTimeout(cachedTimeout)
	out.SetAttrTimeout(cachedTimeout)
}

// add records n as the node of the file events name fid. A node the
// kernel still holds stays the one of its fid.
func (m *metaCache) add(fid watch.FID, n *gofs.Inode) {
	m.nodesMu.Lock()
	defer m.nodesMu.Unlock()
	old := m.held(fid)
	//lint:ignore SA1019 the kernel's reference is what matters here, not a callback
	if old == n || old != nil && !old.Forgotten() {
		return
	}
	m.nodes.Store(fid, n)
	m.keys[n] = append(m.keys[n], fid)
	if j := m.journal; j != nil && !j.add(n, fid) && !j.full {
		j.full = true
		m.srv.log.Warn("node journal full: after a crash, nodes past it are unknown to the next daemon", zap.Int("slots", journalSlots))
	}
}

// noteHandle journals fh as a handle number handed to the kernel.
func (m *metaCache) noteHandle(fh uint64) {
	m.nodesMu.Lock()
	if m.journal != nil {
		m.journal.noteHandle(fh)
	}
	m.nodesMu.Unlock()
}

// forget drops n: the kernel holds it no longer.
func (m *metaCache) forget(n *gofs.Inode) {
	m.nodesMu.Lock()
	for _, fid := range m.keys[n] {
		m.nodes.CompareAndDelete(fid, n)
	}
	delete(m.keys, n)
	if m.journal != nil {
		m.journal.drop(n)
	}
	m.nodesMu.Unlock()
}

// held is the node of the file events name fid, or nil when the kernel
// holds none.
func (m *metaCache) held(fid watch.FID) *gofs.Inode {
	if fid == "" {
		return nil
	}
	if v, ok := m.nodes.Load(fid); ok {
		return v.(*gofs.Inode)
	}
	return nil
}

// enqueue queues c for the handler when it is about a node the kernel
// holds (the directory of its name, or the file itself): changes to
// anything else on SOURCE's filesystem are none of the mount's business.
func (m *metaCache) enqueue(c watch.Change) {
	if m.held(c.Dir) == nil && m.held(c.Self) == nil {
		return
	}
	m.push(metaEvent{c: c})
}

// metaEvent is what the handler is told: a change c, or a filesystem
// mounted on or unmounted from mountedOn (a path beneath SOURCE).
type metaEvent struct {
	c         watch.Change
	mountedOn string
}

// enqueueMount queues the mount point p when it lies beneath SOURCE (as
// SOURCE's path is now: it may have been renamed).
func (m *metaCache) enqueueMount(p string) {
	m.mu.Lock()
	if m.stop { // source is closed or being closed
		m.mu.Unlock()
		return
	}
	src, err := os.Readlink(procPath(int(m.source.Fd())))
	m.mu.Unlock()
	if err != nil {
		return
	}
	rel, ok := strings.CutPrefix(p, strings.TrimSuffix(src, "/")+"/")
	if !ok || rel == "" {
		return
	}
	m.push(metaEvent{mountedOn: rel})
}

func (m *metaCache) push(e metaEvent) {
	m.mu.Lock()
	if len(m.queue) >= maxQueued {
		m.queue, m.lost = nil, true
	} else {
		m.queue = append(m.queue, e)
	}
	m.queued++
	m.cond.Broadcast()
	m.mu.Unlock()
}

func (m *metaCache) enqueueLost() {
	m.srv.log.Warn("change events lost: invalidating every cached entry and attribute")
	m.invalidateEverything("change events were lost", nil)
}

// adopted has the kernel drop everything it caches of the mount once an
// adopted mount serves: SOURCE's changes between the predecessor's last
// event and this daemon's first (seconds after a crash or a restart
// through the descriptor store) were seen by no daemon. unknown are node
// ids the kernel may hold that this daemon has no node for: their
// attributes are dropped too, so the kernel asks, gets ESTALE and looks
// the name up again.
func (m *metaCache) adopted(unknown []uint64) {
	if m.on {
		m.invalidateEverything("the mount was adopted: SOURCE may have changed while no daemon watched it", unknown)
	}
}

func (m *metaCache) invalidateEverything(why string, unknown []uint64) {
	m.mu.Lock()
	m.queue, m.lost, m.lostWhy = nil, true, why
	m.unknown = append(m.unknown, unknown...)
	m.queued++
	m.cond.Broadcast()
	m.mu.Unlock()
}

// run handles queued changes until close.
func (m *metaCache) run() {
	defer close(m.done)
	m.mu.Lock()
	for {
		for !m.stop && (m.paused || len(m.queue) == 0 && !m.lost) {
			m.cond.Wait()
		}
		if m.stop {
			m.mu.Unlock()
			return
		}
		q, lost, why, unknown, upto := m.queue, m.lost, m.lostWhy, m.unknown, m.queued
		m.queue, m.lost, m.unknown = nil, false, nil
		m.busy = true
		m.mu.Unlock()
		if lost {
			for _, id := range unknown {
				m.srv.fuse.InodeNotify(id, -1, 0)
			}
			m.invalidateAll(why)
		} else {
			for _, e := range q {
				if e.mountedOn != "" {
					m.invalidateMount(e.mountedOn)
				} else {
					m.invalidate(e.c)
				}
			}
		}
		m.mu.Lock()
		m.handled, m.busy = upto, false
		m.cond.Broadcast()
	}
}

// settle returns once every change queued before it was handled, or
// the handler is paused (it handles nothing until unpaused).
func (m *metaCache) settle() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for want := m.queued; m.handled < want && !m.stop && !m.paused; {
		m.cond.Wait()
	}
}

func (m *metaCache) close() {
	m.mu.Lock()
	m.stop = true
	m.cond.Broadcast()
	m.mu.Unlock()
	if m.done != nil {
		<-m.done
		m.mu.Lock() // close may run twice at once (Wait, Abandon)
		if m.conn >= 0 {
			unix.Close(m.conn)
			m.conn = -1
		}
		m.mu.Unlock()
	}
	if m.source != nil {
		m.source.Close()
	}
	m.nodesMu.Lock()
	if m.journal != nil {
		m.journal.close()
		m.journal = nil
	}
	m.nodesMu.Unlock()
}

// entryEvents change a directory's entries.
const entryEvents = unix.FAN_CREATE | unix.FAN_DELETE | unix.FAN_MOVED_FROM | unix.FAN_MOVED_TO

// invalidate tells the kernel what c changed: the entry it names and its
// directory's listing and attributes, and the attributes of the object
// (every name of it: hard links are one node).
func (m *metaCache) invalidate(c watch.Change) {
	dir := m.held(c.Dir)
	if dir != nil && c.Name != "." && c.Mask&entryEvents != 0 {
		m.expireEntry(dir, c.Name)
		dir.NotifyContent(0, 0)
	}
	self := m.held(c.Self)
	named := dir
	if dir != nil && c.Name != "." {
		named = dir.GetChild(c.Name)
	}
	if named == self {
		named = nil
	}
	if self != nil && m.toldAtOpen(self, c.Self) {
		self = nil
	}
	for _, n := range []*gofs.Inode{self, named} {
		if n != nil {
			forgetXattrs(n)
			n.NotifyContent(-1, 0)
		}
	}
}

// expireEntry tells the kernel that its entry name in dir may be stale:
// its next use asks the daemon again (a lookup that finds another file
// or none drops it then). The entry is not dropped now
// (FUSE_EXPIRE_ONLY, protocol 7.38): a file open under that name keeps
// its path (/proc/PID/fd, which loaders read to find a file from its
// descriptor), and a directory its submounts. A kernel without it drops
// the entry.
func (m *metaCache) expireEntry(dir *gofs.Inode, name string) {
	if m.conn < 0 {
		dir.NotifyEntry(name)
		return
	}
	const notifyInvalEntry, expireOnly = 3, 1
	parent := dir.StableAttr().Ino // the node id (nodeids.go)
	if dir.IsRoot() {
		parent = fuse.FUSE_ROOT_ID
	}
	e := fuse.NotifyInvalEntryOut{Parent: parent, NameLen: uint32(len(name)), Flags: expireOnly}
	// ENOENT: the kernel holds no such entry; any other error: the
	// connection ended.
	unix.Write(m.conn, notification(notifyInvalEntry, rawBytes(&e), []byte(name), []byte{0}))
}

// invalidateMount tells the kernel that the entry at rel (beneath
// SOURCE) names another directory: a filesystem was mounted there or
// unmounted.
func (m *metaCache) invalidateMount(rel string) {
	dir := m.srv.tree.EmbeddedInode()
	names := strings.Split(rel, "/")
	for _, name := range names[:len(names)-1] {
		if dir = dir.GetChild(name); dir == nil {
			return
		}
	}
	name := names[len(names)-1]
	ch := dir.GetChild(name)
	m.expireEntry(dir, name)
	if ch != nil {
		forgetXattrs(ch)
		ch.NotifyContent(-1, 0)
	}
}

// toldAtOpen reports whether the kernel was told of the version of i's
// file (fid) now by an open through the mount since it changed (open.go drops
// the kernel's attributes and pages of a changed file before the open
// returns). Telling it again would race the attributes that open's
// caller is reading: the kernel discards a reply that crosses an
// invalidation, keeping the size it had.
func (m *metaCache) toldAtOpen(i *gofs.Inode, fid watch.FID) bool {
	n := asNode(i.Operations())
	if n == nil || !isRegular(i.StableAttr().Mode) {
		return false
	}
	n.mu.Lock()
	seen := n.seen
	n.mu.Unlock()
	if seen == (fileVersion{}) {
		return false
	}
	st := m.stat(fid)
	return st != nil && versionOf(st) == seen
}

// forgetXattrs forgets the security.* names known absent on i.
func forgetXattrs(i *gofs.Inode) {
	if n := asNode(i.Operations()); n != nil {
		n.forgetXattrs()
	}
}

// invalidateAll invalidates every entry, attribute and listing the kernel
// may hold, for the reason why.
func (m *metaCache) invalidateAll(why string) {
	nodes := map[*gofs.Inode]bool{}
	defer func() {
		m.srv.log.Info("the kernel dropped every cached entry and attribute of the mount",
			zap.String("why", why), zap.Int("nodes", len(nodes)))
	}()
	m.nodes.Range(func(_, v any) bool { nodes[v.(*gofs.Inode)] = true; return true })
	for n := range nodes {
		if n.IsDir() {
			for name := range n.Children() {
				m.expireEntry(n, name)
			}
			n.NotifyContent(0, 0)
		}
		forgetXattrs(n)
		n.NotifyContent(-1, 0)
	}
}

// stat is the attributes of the file events name fid, or nil when it is
// gone.
func (m *metaCache) stat(fid watch.FID) *syscall.Stat_t {
	h, ok := fid.Handle()
	if !ok {
		return nil
	}
	fd, err := unix.OpenByHandleAt(int(m.source.Fd()), h, unix.O_PATH)
	if err != nil {
		return nil
	}
	defer unix.Close(fd)
	st, _, err := fstatx(fd)
	if err != nil {
		return nil
	}
	return st
}

// attrTimeout sets out's timeout when the kernel may cache n's
// attributes for long.
func (n *node) attrTimeout(out *fuse.AttrOut) {
	if n.cachedMeta() {
		out.SetTimeout(cachedTimeout)
	}
}
