package fs

import (
	"os"
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

	// mu and nodesMu are never held together.
	mu      sync.Mutex
	cond    *sync.Cond     // queued, handled or stop changed
	queue   []watch.Change // guarded by mu
	lost    bool           // events were lost: invalidate everything; guarded by mu
	queued  uint64         // changes queued so far (a lost counts one); guarded by mu
	handled uint64         // changes handled so far; guarded by mu
	stop    bool           // guarded by mu
	done    chan struct{}  // closed when run returns; nil when it never ran

	nodesMu sync.Mutex
	nodes   map[uint64]*gofs.Inode // by stable inode number, the nodes the kernel may cache; guarded by nodesMu
}

// maxQueued bounds the queue: past it, everything is invalidated at once.
const maxQueued = 1 << 16

// probeMeta asks whether SOURCE's filesystem reports changes and, when it
// does, subscribes: changes from then on are queued. Called before the
// mount serves.
func (s *Server) probeMeta(w Watcher) {
	m := &s.meta
	m.srv, m.nodes = s, map[uint64]*gofs.Inode{}
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
		m.source = f
		w.Subscribe(watch.Subscriber{Entries: m.enqueue, Lost: m.enqueueLost})
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
	m.add(s.tree.StableAttr().Ino, s.tree.EmbeddedInode())
	var st *syscall.Stat_t
	var id fileID
	if s.root.At(func(dirfd int) (err error) { st, id, err = fstatx(dirfd); return err }) == nil {
		m.add(s.stableAttr(st, id).Ino, s.tree.EmbeddedInode())
	}
	m.done = make(chan struct{})
	go m.run()
}

// cached reports whether the kernel may cache the node id for long.
func (m *metaCache) cached(id fileID) bool { return m.on && id.dev == m.srv.dev }

// cachedMeta reports whether the kernel may cache n's entry, attributes
// and listing for long.
func (n *node) cachedMeta() bool {
	return n.srv.meta.on && (n.IsRoot() || n.id.dev == n.srv.dev)
}

// settle hands every change reported before it to the kernel.
func (s *Server) settle(w Watcher) {
	w.Drain()
	s.meta.settle()
}

// entryTimeouts sets out's timeouts for a node of id.
func (m *metaCache) entryTimeouts(id fileID, out *fuse.EntryOut) {
	if m.cached(id) {
		out.SetEntryTimeout(cachedTimeout)
		out.SetAttrTimeout(cachedTimeout)
	}
}

// add records n as the node of ino. A node made by a lookup is not the
// one go-fuse answers with when the kernel still holds another of the
// same inode (a hard link, or a lookup racing another): that one stays.
func (m *metaCache) add(ino uint64, n *gofs.Inode) {
	if !m.on {
		return
	}
	m.nodesMu.Lock()
	//lint:ignore SA1019 the kernel's reference is what matters here, not a callback
	if old := m.nodes[ino]; old == nil || old.Forgotten() {
		m.nodes[ino] = n
	}
	m.nodesMu.Unlock()
}

func (m *metaCache) forget(ino uint64, n *gofs.Inode) {
	m.nodesMu.Lock()
	if m.nodes[ino] == n {
		delete(m.nodes, ino)
	}
	m.nodesMu.Unlock()
}

func (m *metaCache) enqueue(c watch.Change) {
	m.mu.Lock()
	if len(m.queue) >= maxQueued {
		m.queue, m.lost = nil, true
	} else {
		m.queue = append(m.queue, c)
	}
	m.queued++
	m.cond.Broadcast()
	m.mu.Unlock()
}

func (m *metaCache) enqueueLost() {
	m.mu.Lock()
	m.queue, m.lost = nil, true
	m.queued++
	m.cond.Broadcast()
	m.mu.Unlock()
}

// run handles queued changes until close.
func (m *metaCache) run() {
	defer close(m.done)
	m.mu.Lock()
	for {
		for !m.stop && len(m.queue) == 0 && !m.lost {
			m.cond.Wait()
		}
		if m.stop {
			m.mu.Unlock()
			return
		}
		q, lost, upto := m.queue, m.lost, m.queued
		m.queue, m.lost = nil, false
		m.mu.Unlock()
		if lost {
			m.invalidateAll()
		} else {
			for _, c := range q {
				m.invalidate(c)
			}
		}
		m.mu.Lock()
		m.handled = upto
		m.cond.Broadcast()
	}
}

// settle returns once every change queued before it was handled.
func (m *metaCache) settle() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for want := m.queued; m.handled < want && !m.stop; {
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
	}
	if m.source != nil {
		m.source.Close()
	}
}

// entryEvents change a directory's entries.
const entryEvents = unix.FAN_CREATE | unix.FAN_DELETE | unix.FAN_MOVED_FROM | unix.FAN_MOVED_TO

// invalidate tells the kernel what c changed: the entry it names and its
// directory's listing and attributes, and the attributes of the object
// (every name of it: hard links are one node).
func (m *metaCache) invalidate(c watch.Change) {
	dir, _ := m.node(c.Dir)
	if dir != nil && c.Name != "." && c.Mask&entryEvents != 0 {
		dir.NotifyEntry(c.Name)
		dir.NotifyContent(0, 0)
	}
	self, st := m.node(c.Self)
	named := dir
	if dir != nil && c.Name != "." {
		named = dir.GetChild(c.Name)
	}
	if named == self {
		named = nil
	}
	if self != nil && toldAtOpen(self, st) {
		self = nil
	}
	for _, n := range []*gofs.Inode{self, named} {
		if n != nil {
			forgetXattrs(n)
			n.NotifyContent(-1, 0)
		}
	}
}

// toldAtOpen reports whether the kernel was told of the version st of
// i's file by an open through the mount since it changed (open.go drops
// the kernel's attributes and pages of a changed file before the open
// returns). Telling it again would race the attributes that open's
// caller is reading: the kernel discards a reply that crosses an
// invalidation, keeping the size it had.
func toldAtOpen(i *gofs.Inode, st *syscall.Stat_t) bool {
	n := asNode(i.Operations())
	if n == nil || !isRegular(st.Mode) {
		return false
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.seen != (fileVersion{}) && n.seen == versionOf(st)
}

// forgetXattrs forgets the security.* names known absent on i.
func forgetXattrs(i *gofs.Inode) {
	if n := asNode(i.Operations()); n != nil {
		n.forgetXattrs()
	}
}

// invalidateAll invalidates every entry, attribute and listing the kernel
// may hold: events were lost.
func (m *metaCache) invalidateAll() {
	m.srv.log.Warn("change events lost: invalidating every cached entry and attribute")
	m.nodesMu.Lock()
	nodes := make([]*gofs.Inode, 0, len(m.nodes))
	for _, n := range m.nodes {
		nodes = append(nodes, n)
	}
	m.nodesMu.Unlock()
	for _, n := range nodes {
		if n.IsDir() {
			for name := range n.Children() {
				n.NotifyEntry(name)
			}
			n.NotifyContent(0, 0)
		}
		forgetXattrs(n)
		n.NotifyContent(-1, 0)
	}
}

// node is the node of the file id names, with the file's attributes, or
// nil when the kernel holds none (or the file is gone).
func (m *metaCache) node(id watch.FID) (*gofs.Inode, *syscall.Stat_t) {
	h, ok := id.Handle()
	if !ok {
		return nil, nil
	}
	fd, err := unix.OpenByHandleAt(int(m.source.Fd()), h, unix.O_PATH)
	if err != nil {
		return nil, nil
	}
	st, fid, err := fstatx(fd)
	unix.Close(fd)
	if err != nil {
		return nil, nil
	}
	m.nodesMu.Lock()
	defer m.nodesMu.Unlock()
	if n := m.nodes[m.srv.stableAttr(st, fid).Ino]; n != nil {
		return n, st
	}
	return nil, nil
}

// attrTimeout sets out's timeout when the kernel may cache n's
// attributes for long.
func (n *node) attrTimeout(out *fuse.AttrOut) {
	if n.cachedMeta() {
		out.SetTimeout(cachedTimeout)
	}
}
