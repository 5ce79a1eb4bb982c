package fs

import (
	"errors"
	"sync"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// kernelRefs is what the kernel holds of the mount, as umaskFS sees it
// pass: its lookup count of every node id (entry replies add one, FORGET
// takes some away) and every open file handle. A successor daemon gets
// both (handover.go). It also guards go-fuse's node layer, which panics
// on a node id or handle it does not know: a request naming one the
// kernel was never given (or one a predecessor gave that did not survive
// the hand-over) answers ESTALE or EBADF, and a FORGET never takes more
// than was given.
//
// Every request passes enter/exit, which also lets Handoff wait for the
// requests in flight (stop). Once Handoff switched go-fuse's descriptor,
// a later one can only be one go-fuse read from the connection in the
// instant of the switch. Where the kernel resends what a daemon read and
// did not answer (hold), it waits in enter: Resume lets it through, and
// after Abandon it is never answered, so the kernel still holds it for
// the successor, which asks for it again (adopt.go). Elsewhere it is
// answered (the reply is forwarded) after the state was taken: a
// successor does not know of a node or handle it added.
type kernelRefs struct {
	mu       sync.Mutex
	cond     *sync.Cond        // inflight, stopped, gone, nodes or fhs changed
	nodes    map[uint64]uint64 // node id -> the kernel's lookup count; guarded by mu; INVARIANT: no zero counts
	fhs      map[uint64]fhRef  // file handles the kernel holds; guarded by mu
	inflight int               // requests between enter and exit; guarded by mu
	stopped  bool              // Handoff waits for inflight to drop to 0; guarded by mu
	hold     bool              // while stopped, enter waits (the kernel resends what is not answered); guarded by mu
	gone     bool              // requests fail in enter (Abandon); guarded by mu
	pending  sync.Map          // <-chan struct{} (a request's cancel) -> gofs.FileHandle the request opened
	plus     sync.Map          // <-chan struct{} -> struct{}: a READDIRPLUS in flight
	// noteFh is told each handle number handed to the kernel (the node
	// journal keeps the highest); nil: none. Set before serving.
	noteFh func(fh uint64)
}

// fhRef is an open file handle: the node it was opened on and what the
// node layer returned.
type fhRef struct {
	node    uint64 // 0: a dead predecessor's number, held back (adoptHandles)
	h       gofs.FileHandle
	backing int32 // the passthrough backing id the reply named
}

func (r *kernelRefs) init() {
	r.cond = sync.NewCond(&r.mu)
	r.nodes = map[uint64]uint64{}
	r.fhs = map[uint64]fhRef{}
}

// enter admits a request naming node ids id1, id2 and handles fh1, fh2
// (0: none), or answers the errno for an unknown one.
func (r *kernelRefs) enter(id1, id2, fh1, fh2 uint64) fuse.Status {
	r.mu.Lock()
	defer r.mu.Unlock()
	for r.stopped && r.hold && !r.gone {
		r.cond.Wait()
	}
	if r.gone {
		return fuse.Status(syscall.ESHUTDOWN)
	}
	for _, id := range [2]uint64{id1, id2} {
		if id > fuse.FUSE_ROOT_ID && r.nodes[id] == 0 {
			return fuse.Status(syscall.ESTALE)
		}
	}
	for i, fh := range [2]uint64{fh1, fh2} {
		if fh != 0 && !r.holdsLocked([2]uint64{id1, id2}[i], fh) {
			return fuse.Status(syscall.EBADF)
		}
	}
	r.inflight++
	return fuse.OK
}

// holds reports whether the kernel holds handle fh of node id from this
// daemon (or its hand-over's predecessor). After a crash, the kernel's
// handles of the dead daemon are not, and their numbers may since name
// a handle of another node (go-fuse hands out the lowest free number):
// a request naming the handle with another node id is not its.
func (r *kernelRefs) holds(id, fh uint64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.holdsLocked(id, fh)
}

func (r *kernelRefs) holdsLocked(id, fh uint64) bool {
	ref, ok := r.fhs[fh]
	return ok && ref.node != 0 && (id == 0 || ref.node == id)
}

// releaseDead forgets fh when it is a dead predecessor's handle number
// held back (adoptHandles: registered on the root, node 0 here) and
// reports whether it was.
func (r *kernelRefs) releaseDead(fh uint64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if ref, ok := r.fhs[fh]; !ok || ref.node != 0 {
		return false
	}
	delete(r.fhs, fh)
	r.cond.Broadcast()
	return true
}

func (r *kernelRefs) exit() {
	r.mu.Lock()
	if r.inflight--; r.inflight == 0 && r.stopped {
		r.cond.Broadcast()
	}
	r.mu.Unlock()
}

// entry counts the reference an entry reply gives the kernel.
func (r *kernelRefs) entry(st fuse.Status, out *fuse.EntryOut) {
	if st.Ok() && out.NodeId != 0 {
		r.ref(out.NodeId, 1)
	}
}

func (r *kernelRefs) ref(id, n uint64) {
	if id == fuse.FUSE_ROOT_ID {
		return
	}
	r.mu.Lock()
	r.nodes[id] += n
	r.mu.Unlock()
}

// forget takes up to n references of id away and returns how many the
// kernel held.
func (r *kernelRefs) forget(id, n uint64) uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := r.nodes[id]
	n = min(n, c)
	if c -= n; c == 0 {
		delete(r.nodes, id)
	} else {
		r.nodes[id] = c
	}
	r.cond.Broadcast()
	return n
}

// stash records the handle a request (its cancel channel) opened, for
// opened to pick up.
func (r *kernelRefs) stash(cancel <-chan struct{}, h gofs.FileHandle) {
	if cancel != nil {
		r.pending.Store(cancel, h)
	}
}

// opened records the handle a successful open gave the kernel (and, for
// a creating open, the entry). A file whose node has a predecessor's
// backing id reads through it: the kernel takes no other for the inode.
func (r *kernelRefs) opened(cancel <-chan struct{}, st fuse.Status, entry *fuse.EntryOut, node uint64, out *fuse.OpenOut) {
	v, _ := r.pending.LoadAndDelete(cancel)
	if !st.Ok() {
		return
	}
	if entry != nil {
		r.entry(st, entry)
	}
	if out.Fh == 0 {
		return
	}
	h, _ := v.(gofs.FileHandle)
	if f, ok := h.(*file); ok && f.node.backing != 0 && out.BackingID == 0 {
		out.BackingID = f.node.backing
		out.OpenFlags = out.OpenFlags&^fuse.FOPEN_KEEP_CACHE | fuse.FOPEN_PASSTHROUGH
	}
	r.mu.Lock()
	r.fhs[out.Fh] = fhRef{node: node, h: h, backing: out.BackingID}
	r.mu.Unlock()
	if r.noteFh != nil {
		r.noteFh(out.Fh)
	}
}

// release forgets fh; false when the kernel held no such handle.
func (r *kernelRefs) release(fh uint64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.fhs[fh]; !ok {
		return false
	}
	delete(r.fhs, fh)
	r.cond.Broadcast()
	return true
}

// inPlus reports whether the request (its cancel channel) is a
// READDIRPLUS, whose entries go-fuse counts inside the node layer.
func (r *kernelRefs) inPlus(cancel <-chan struct{}) bool {
	_, ok := r.plus.Load(cancel)
	return ok
}

// errBusy is Handoff's error when a request does not finish.
var errBusy = errors.New("a FUSE request in flight did not finish (a blocking lock?)")

// stop waits until no request is in flight, or until timeout: then it
// fails. With hold, requests that come later wait in enter until resume
// or abandon.
func (r *kernelRefs) stop(timeout time.Duration, hold bool) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stopped, r.hold = true, hold
	expired := false
	t := time.AfterFunc(timeout, func() {
		r.mu.Lock()
		expired = true
		r.cond.Broadcast()
		r.mu.Unlock()
	})
	defer t.Stop()
	for r.inflight > 0 && !expired {
		r.cond.Wait()
	}
	if r.inflight > 0 {
		r.stopped = false
		r.cond.Broadcast()
		return errBusy
	}
	return nil
}

// resume ends stop's state.
func (r *kernelRefs) resume() {
	r.mu.Lock()
	r.stopped = false
	r.cond.Broadcast()
	r.mu.Unlock()
}

// abandon fails every request from now on, those waiting too. The
// caller has pointed go-fuse's descriptor away from the connection
// first: the replies of those waiting never reach the kernel.
func (r *kernelRefs) abandon() {
	r.mu.Lock()
	r.gone = true
	r.cond.Broadcast()
	r.mu.Unlock()
}

// snapshot copies the tables (while stopped).
func (r *kernelRefs) snapshot() (map[uint64]uint64, map[uint64]fhRef) {
	r.mu.Lock()
	defer r.mu.Unlock()
	nodes := make(map[uint64]uint64, len(r.nodes))
	for k, v := range r.nodes {
		nodes[k] = v
	}
	fhs := make(map[uint64]fhRef, len(r.fhs))
	for k, v := range r.fhs {
		fhs[k] = v
	}
	return nodes, fhs
}
