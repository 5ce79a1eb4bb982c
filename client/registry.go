package client

import (
	"container/list"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"

	"github.com/gdsfs/gdsfs/client/chunkmap"
	"github.com/gdsfs/gdsfs/proto"
)

// mapped is one file's mapping in this process, shared by the Leases of
// it and kept (idle) after the last one closes while the daemon allows.
type mapped struct {
	key   string // location.key(); "" for a lease taken with Conn.Acquire
	conn  *holder
	g     proto.Grant
	m     chunkmap.Mapping
	users int           // Leases using m; guarded by reg
	cache bool          // the daemon allowed keeping it after release
	stale bool          // never handed out again
	elem  *list.Element // in reg.idle while kept with no user
}

// holder is a connection, the mappings it holds and the requests using
// it. The daemon holds a mapping's bytes until the connection closes or
// the client drops them. Fresh leases (Open, and OpenMany's batches) are
// made on a connection of the process's pool for that daemon that no
// other request is using, a new one where all are busy; repeat leases on
// the connection holding their mapping. A mapping undone while its
// connection stays open is dropped on it; a registry-opened connection
// is closed when it holds no mapping and no request uses it. So a process
// holds about as many connections as it makes requests at once, and an
// idle one none.
type holder struct {
	c     *Conn
	pool  string // its pool's key (poolKey), "" for none
	refs  int    // guarded by reg
	busy  int    // requests using it; guarded by reg
	owned bool   // opened by the registry: closed with its last mapping
}

// maxIdle bounds the mappings kept with no lease using them, maxConns the
// registry-opened connections holding mappings: past either the oldest
// kept mappings are undone. Connections are few: every process of a uid
// shares the daemon's ipc.max_connections_per_uid (1024 by default), and
// an idle process must not hold a share of it.
const (
	maxIdle  = 4096
	maxConns = 16
)

// reg is this process's mapped files and where files were found.
var reg registry

type registry struct {
	mu      sync.Mutex
	files   map[string]*mapped   // current mapping per location
	idle    list.List            // of *mapped kept with no user; front = most recent
	conns   int                  // owned holders with mappings
	pools   map[string][]*holder // by poolKey: the connections fresh leases are made on
	located map[string]located   // by resolved directory
}

// location is where a path is leased from, and on which device.
type location struct {
	socket, rel string
	owner       int    // the mount's owner: its daemon must run as it or root
	device      string // the device requests name ("": none)
	roomWaitMS  int64  // the room_wait_ms requests send (0: none; RoomWait)
	remembered  bool   // from the per-directory memory, not looked up now
}

// key identifies a mapping: a lease on another device is another one.
func (l location) key() string { return l.socket + "\x00" + l.rel + "\x00" + l.device }

// locateOn is locateCached with the device and room wait opts name.
func locateOn(path string, opts []LeaseOption) (location, error) {
	loc, err := locateCached(path)
	loc.device, loc.roomWaitMS = deviceFor(opts), roomWaitMS(opts)
	return loc, err
}

// located is where a directory's files were found: the path's symbolic
// links (the file's own too) are resolved at every lookup, and the memory is used
// only while the resolved directory is still the same inode, and not for a
// path with a mount of its own (mountedOver); a mount point is not
// remembered for its directory.
type located struct {
	socket, reldir string
	owner          int
	dev, ino       uint64
}

// locateCached is Locate, remembered per resolved directory (reading
// mountinfo and .gdsfs/socket costs more than a repeat lease).
func locateCached(path string) (location, error) {
	if os.Getenv("GDSFS_SOCKET") != "" {
		t, err := find(path)
		return location{socket: t.socket, rel: t.rel, owner: t.owner}, err
	}
	abs, err := resolve(path) // the file's own link too, where it exists
	if err != nil {
		return location{}, err
	}
	dir, base := filepath.Split(abs)
	real := filepath.Clean(dir) // resolved by resolve where it exists
	var st syscall.Stat_t
	if syscall.Stat(real, &st) != nil {
		t, err := find(path) // says what is wrong with the path
		return location{socket: t.socket, rel: t.rel, owner: t.owner}, err
	}
	reg.mu.Lock()
	hit, ok := reg.located[real]
	reg.mu.Unlock()
	file := filepath.Join(real, base)
	if ok && hit.dev == st.Dev && hit.ino == st.Ino && !mountedOver(file, st.Dev) {
		return location{socket: hit.socket, rel: filepath.Join(hit.reldir, base), owner: hit.owner, remembered: true}, nil
	}
	t, err := find(file)
	if err != nil {
		return location{}, err
	}
	if t.mnt == file {
		// a mount point: its directory is another mount's, or none's
		return location{socket: t.socket, rel: t.rel, owner: t.owner}, nil
	}
	reg.mu.Lock()
	if reg.located == nil || len(reg.located) > 4096 {
		reg.located = map[string]located{}
	}
	reg.located[real] = located{socket: t.socket, reldir: filepath.Dir(t.rel), owner: t.owner, dev: st.Dev, ino: st.Ino}
	reg.mu.Unlock()
	return location{socket: t.socket, rel: t.rel, owner: t.owner}, nil
}

// mountedOver says whether path is the root of a mount of another
// device than its directory's (dev): a nested mount, or a file or
// directory bind-mounted there from another filesystem. What is
// remembered of the directory does not hold for it.
func mountedOver(path string, dev uint64) bool {
	var st syscall.Stat_t
	return syscall.Lstat(path, &st) == nil && st.Dev != dev
}

// forget drops where files were found.
func forget() {
	reg.mu.Lock()
	reg.located = nil
	reg.mu.Unlock()
}

// poolKey names the pool of connections to socket whose listener was
// checked to be owner.
func poolKey(socket string, owner int) string {
	return fmt.Sprintf("%s\x00%d", socket, owner)
}

// leaseHolder returns a connection for a fresh lease at loc, marked busy
// (checkin gives it back), and whether it is new: the first of the pool's
// connections that no request uses, else a new one, which joins the
// pool. A connection whose daemon does not know drop is not used again
// for fresh leases.
func (r *registry) leaseHolder(loc location) (*holder, bool, error) {
	key := poolKey(loc.socket, loc.owner)
	r.mu.Lock()
	for _, h := range r.pools[key] {
		if h.busy == 0 && !h.c.broken() && !h.c.noDrop.Load() {
			h.busy = 1
			r.mu.Unlock()
			return h, false, nil
		}
	}
	r.mu.Unlock()
	c, err := dial(loc.socket, loc.owner)
	if err != nil {
		return nil, false, err
	}
	h := &holder{c: c, pool: key, busy: 1, owned: true}
	r.mu.Lock()
	if r.pools == nil {
		r.pools = map[string][]*holder{}
	}
	r.pools[key] = append(r.pools[key], h)
	r.mu.Unlock()
	return h, true, nil
}

// checkin ends a request's use of h, closing it if it holds no mapping.
func (r *registry) checkin(h *holder) {
	r.mu.Lock()
	h.busy--
	closing := h.busy == 0 && h.refs == 0
	if closing {
		r.forgetLocked(h)
	}
	r.mu.Unlock()
	if closing {
		h.c.Close()
	}
}

// forgetLocked takes h out of its pool.
func (r *registry) forgetLocked(h *holder) {
	hs := r.pools[h.pool]
	for i, o := range hs {
		if o == h {
			hs = append(hs[:i:i], hs[i+1:]...)
			break
		}
	}
	if len(hs) == 0 {
		delete(r.pools, h.pool)
	} else {
		r.pools[h.pool] = hs
	}
}

// take returns the current mapping for key, counted as used, if there is
// one worth a repeat lease.
func (r *registry) take(key string) *mapped {
	r.mu.Lock()
	defer r.mu.Unlock()
	f := r.files[key]
	if f == nil || f.stale || f.conn.c.broken() {
		return nil
	}
	f.users++
	if f.elem != nil {
		r.idle.Remove(f.elem)
		f.elem = nil
	}
	return f
}

// adopt maps a grant's descriptors (closing them) as the current mapping
// of loc, held by h, with one user.
func (r *registry) adopt(h *holder, loc location, g *proto.Grant, files []*os.File) (*mapped, error) {
	m, err := mapFiles(g, files)
	if err != nil {
		return nil, err
	}
	f := &mapped{key: loc.key(), conn: h, g: *g, m: m, users: 1, cache: g.Cache && g.Sharing == proto.SharingShared}
	f.g.Chunks = nil
	r.mu.Lock()
	h.refs++
	if h.refs == 1 && h.owned {
		r.conns++
	}
	var drop []*mapped
	if old := r.files[f.key]; old != nil {
		old.stale = true
		if old.users == 0 {
			drop = append(drop, old)
			r.removeLocked(old)
		}
	}
	if r.files == nil {
		r.files = map[string]*mapped{}
	}
	r.files[f.key] = f
	closing := r.unrefLocked(drop)
	r.mu.Unlock()
	undo(drop, closing, nil)
	return f, nil
}

// discard gives back a mapping taken for a repeat lease that failed: it
// is not handed out again.
func (r *registry) discard(f *mapped) {
	r.mu.Lock()
	f.users--
	f.stale = true
	var drop []*mapped
	if f.users == 0 {
		drop = append(drop, f)
		r.removeLocked(f)
	}
	closing := r.unrefLocked(drop)
	r.mu.Unlock()
	undo(drop, closing, nil)
}

// finish ends lease l: the mapping is kept for a repeat lease when the
// daemon allowed it, else undone (then its connection closed when it was
// the last mapping it held). The lease id is released unless its
// connection is closed anyway.
func (r *registry) finish(l *Lease) error {
	f := l.f
	r.mu.Lock()
	f.users--
	var drop []*mapped
	var closing []*holder
	if f.users == 0 {
		if f.cache && !f.stale && f.key != "" && !f.conn.c.broken() {
			f.elem = r.idle.PushFront(f)
			for r.idle.Len() > 0 && (r.idle.Len() > maxIdle || r.conns > maxConns) {
				v := r.idle.Back().Value.(*mapped)
				r.removeLocked(v)
				drop = append(drop, v)
				closing = append(closing, r.unrefLocked([]*mapped{v})...)
			}
		} else {
			r.removeLocked(f)
			drop = append(drop, f)
			closing = r.unrefLocked(drop)
		}
	}
	r.mu.Unlock()
	if !slices.ContainsFunc(closing, func(h *holder) bool { return h.c == l.conn }) {
		l.conn.release(l.id, l.epoch)
	}
	return undo(drop, closing, f)
}

// removeLocked takes f out of the registry (not its connection count).
func (r *registry) removeLocked(f *mapped) {
	if f.elem != nil {
		r.idle.Remove(f.elem)
		f.elem = nil
	}
	if f.key != "" && r.files[f.key] == f {
		delete(r.files, f.key)
	}
	f.stale = true
}

// unrefLocked drops the connection references of the mappings being
// undone and returns the registry-opened connections left with none.
func (r *registry) unrefLocked(drop []*mapped) []*holder {
	var closing []*holder
	for _, f := range drop {
		f.conn.refs--
		if f.conn.refs == 0 && f.conn.owned {
			r.conns--
			if f.conn.busy == 0 {
				closing = append(closing, f.conn)
				r.forgetLocked(f.conn)
			}
		}
	}
	return closing
}

// undo unmaps, then closes the connections (the daemon then ends what
// they held) or, on a registry-opened connection that stays open, drops
// what was unmapped. It returns the unmapping error of first, if any.
func undo(drop []*mapped, closing []*holder, first *mapped) error {
	var err error
	for _, f := range drop {
		if e := f.m.Close(); e != nil {
			if f == first {
				err = e
			}
			continue // still mapped: the daemon goes on holding it
		}
		if f.conn.owned && !slices.Contains(closing, f.conn) {
			f.conn.c.drop(f.g.Generation, f.g.Device)
		}
	}
	for _, h := range closing {
		h.c.Close()
	}
	return err
}

// flushIdle undoes the kept mappings of socket's daemon (all when socket
// is "").
func (r *registry) flushIdle(socket string) {
	r.mu.Lock()
	var drop []*mapped
	for e := r.idle.Front(); e != nil; {
		next := e.Next()
		f := e.Value.(*mapped)
		if socket == "" || f.conn.c.socket == socket {
			r.removeLocked(f)
			drop = append(drop, f)
		}
		e = next
	}
	closing := r.unrefLocked(drop)
	r.mu.Unlock()
	undo(drop, closing, nil)
}

// DropCache undoes every mapping kept for repeat leases (leases still
// open are not touched) and closes the connections left holding nothing,
// so the daemon counts none of it any more. The default device is looked
// for again at the next lease (GDSFS_DEVICE may have changed).
func DropCache() {
	reg.flushIdle("")
	forgetDefaultDevice()
}
