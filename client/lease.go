package client

import (
	"errors"
	"fmt"
	"os"
	"sync"

	"github.com/gdsfs/gdsfs/client/chunkmap"
	"github.com/gdsfs/gdsfs/proto"
)

// Lease is a staged file mapped into this process. The daemon keeps the
// file (counted against its capacity, never evicted) at least until Close.
type Lease struct {
	f     *mapped
	conn  *Conn // the connection the lease id lives on
	id    uint64
	epoch uint64
	grant proto.Grant

	mu     sync.RWMutex // shared by ReadAt, exclusive in Close
	closed bool
}

// ErrClosed is returned by a closed lease's ReadAt.
var ErrClosed = errors.New("gdsfs: lease closed")

// Ptr is the CUDA device pointer of the first byte (GPU), or the address
// of the host mapping (host backend); 0 once closed.
func (l *Lease) Ptr() uint64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.closed {
		return 0
	}
	return l.f.m.Ptr()
}

// Size is the file size in bytes.
func (l *Lease) Size() int64 { return l.grant.Size }

// Device is "GPU-<uuid>" or "host".
func (l *Lease) Device() string { return l.grant.Device }

// Generation changes when the daemon re-stages the file.
func (l *Lease) Generation() uint64 { return l.grant.Generation }

// Sharing is "shared" (a read-only view of the daemon's copy) or
// "private" (this lease's own copy, writable).
func (l *Lease) Sharing() string { return l.grant.Sharing }

// ReadOnly says whether the mapping refuses writes: true for shared
// leases (on a GPU, unless the driver refused read-only access).
func (l *Lease) ReadOnly() bool { return l.f.m.ReadOnly() }

// Reused says whether this lease reused a mapping kept from an earlier
// lease of the same generation (the fast path: no descriptors were sent).
func (l *Lease) Reused() bool { return l.grant.Reuse }

// ReadAt copies staged bytes into p (device to host on a GPU). After
// Close it fails with ErrClosed.
func (l *Lease) ReadAt(p []byte, off int64) (int, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.closed {
		return 0, ErrClosed
	}
	return l.f.m.ReadAt(p, off)
}

// Close ends the lease without waiting for the daemon. The mapping is
// undone, and its connection closed, unless the daemon allowed keeping it
// for a repeat lease (Open) or another lease still uses them. Calling it
// again does nothing. A failed unmapping is the error.
func (l *Lease) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	return reg.finish(l)
}

// Acquire leases path (relative to the mount, or absolute under it) on c
// and maps it. The daemon holds the file until c is closed; the lease's
// Close unmaps it and ends the lease id. opts: OnDevice (default
// DefaultDevice), RoomWait.
func (c *Conn) Acquire(path string, opts ...LeaseOption) (*Lease, error) {
	resp, files, err := c.roundTrip(proto.Request{Op: proto.OpAcquire, Path: path, Device: deviceFor(opts), RoomWaitMS: roomWaitMS(opts)})
	if err != nil {
		return nil, err
	}
	defer closeAll(files)
	m, err := mapGrant(&resp.Grant, files)
	if err != nil {
		c.release(resp.Lease, resp.Epoch)
		return nil, fmt.Errorf("gdsfs acquire %s: map: %w", path, err)
	}
	f := &mapped{conn: &holder{c: c, owned: false}, g: resp.Grant, m: m, users: 1}
	f.conn.refs = 1
	return &Lease{f: f, conn: c, id: resp.Lease, epoch: resp.Epoch, grant: resp.Grant}, nil
}

// Open leases and maps the staged bytes of path, a file under a gdsfs
// mount, staging it first if needed. A file this process has leased before
// and still keeps mapped (see Close) is leased again in one round trip,
// with no descriptors, if it has not changed; a changed one is mapped
// anew. opts: OnDevice (default DefaultDevice: the lease is of the
// replica on the GPU this process runs on, where the daemon stages onto
// several), RoomWait.
func Open(path string, opts ...LeaseOption) (*Lease, error) {
	loc, err := locateOn(path, opts)
	if err != nil {
		return nil, err
	}
	if f := reg.take(loc.key()); f != nil {
		l, err := repeat(f, loc)
		if err == nil {
			return l, nil
		}
		reg.discard(f)
		if !retry(err) {
			return nil, err
		}
	}
	return openFresh(path, loc)
}

// repeat leases an unchanged file on the connection that holds its
// mapping.
func repeat(f *mapped, loc location) (*Lease, error) {
	resp, files, err := f.conn.c.roundTrip(proto.Request{Op: proto.OpAcquire, Path: loc.rel, Generation: f.g.Generation, Device: loc.device, RoomWaitMS: loc.roomWaitMS})
	if err != nil {
		return nil, err
	}
	if resp.Reuse {
		if resp.Generation != f.g.Generation {
			f.conn.c.release(resp.Lease, resp.Epoch)
			return nil, &Error{Code: proto.EPROTO, Msg: fmt.Sprintf("gdsfs acquire %s: reuse of generation %d answered for %d", loc.rel, resp.Generation, f.g.Generation)}
		}
		return &Lease{f: f, conn: f.conn.c, id: resp.Lease, epoch: resp.Epoch, grant: resp.Grant}, nil
	}
	// New bytes on this connection: map them.
	nf, err := reg.adopt(f.conn, loc, &resp.Grant, files)
	if err != nil {
		giveBack(f.conn.c, &resp.Grant, resp.Epoch)
		return nil, err
	}
	reg.discard(f)
	return &Lease{f: nf, conn: f.conn.c, id: resp.Lease, epoch: resp.Epoch, grant: resp.Grant}, nil
}

// dropIfPressed undoes this process's kept mappings of socket's daemon
// (closing their connections) when err says the daemon is at a limit
// they count against: connections (EMFILE), the uid's leases or held
// bytes (EDQUOT), its capacity (ENOSPC).
func dropIfPressed(err error, socket string) {
	var pe *proto.Error
	if errors.As(err, &pe) && (pe.Code == proto.EMFILE || pe.Code == proto.EDQUOT || pe.Code == proto.ENOSPC) {
		reg.flushIdle(socket)
	}
}

// retry says whether a failed repeat lease is worth a fresh connection:
// the file changed (ESTALE) or the connection broke.
func retry(err error) bool {
	var pe *proto.Error
	if errors.As(err, &pe) {
		return pe.Code == proto.ESTALE || pe.Code == proto.EPROTO
	}
	return true // not an answer: the connection failed
}

// openFresh leases path on a connection of the process's pool for its
// daemon (see pooled). A remembered socket no daemon answers on, or a
// pooled connection the daemon closed meanwhile (it restarted), is tried
// once more afresh.
func openFresh(path string, loc location) (*Lease, error) {
	var relocate func() (location, error)
	if loc.remembered {
		dev, wait := loc.device, loc.roomWaitMS
		relocate = func() (location, error) {
			// The daemon restarted or the mount moved: look again.
			forget()
			at, err := locateCached(path)
			at.device, at.roomWaitMS = dev, wait
			return at, err
		}
	}
	h, resp, files, err := pooled(&loc, func(at location) proto.Request {
		return proto.Request{Op: proto.OpAcquire, Path: at.rel, Device: at.device, RoomWaitMS: at.roomWaitMS}
	}, relocate)
	if h == nil {
		return nil, err
	}
	c := h.c
	if err != nil {
		reg.checkin(h)
		dropIfPressed(err, loc.socket)
		return nil, err
	}
	f, err := reg.adopt(h, loc, &resp.Grant, files)
	if err != nil {
		giveBack(c, &resp.Grant, resp.Epoch)
		reg.checkin(h)
		return nil, fmt.Errorf("gdsfs acquire %s: map: %w", path, err)
	}
	reg.checkin(h)
	if !resp.Cache {
		reg.flushIdle(loc.socket) // the daemon is short of room
	}
	return &Lease{f: f, conn: c, id: resp.Lease, epoch: resp.Epoch, grant: resp.Grant}, nil
}

// pooled sends the request req makes for *loc on a connection of the
// process's pool for its daemon (registry.leaseHolder) and returns that
// connection's holder, busy (the caller checks it in), with the answer;
// nil and the error where no connection was had. One failure is tried
// once more, only one: a pooled connection the daemon closed meanwhile
// (it restarted), on a new connection; or, where relocate is not nil, a
// failure to connect, at the location relocate gives (stored in *loc).
func pooled(loc *location, req func(location) proto.Request, relocate func() (location, error)) (*holder, proto.Response, []*os.File, error) {
	for again := false; ; again = true {
		h, isNew, err := reg.leaseHolder(*loc)
		if err != nil {
			if again || relocate == nil {
				return nil, proto.Response{}, nil, err
			}
			if *loc, err = relocate(); err != nil {
				return nil, proto.Response{}, nil, err
			}
			continue
		}
		resp, files, err := h.c.roundTrip(req(*loc))
		var pe *proto.Error
		if err != nil && !again && !isNew && h.c.broken() && !errors.As(err, &pe) {
			reg.checkin(h)
			continue
		}
		return h, resp, files, err
	}
}

// giveBack releases a full grant this process did not map and drops it
// on c (bytes a lease or another grant on c still uses stay held).
func giveBack(c *Conn, g *proto.Grant, epoch uint64) {
	c.release(g.Lease, epoch)
	if g.Generation != 0 && g.Device != "" {
		c.drop(g.Generation, g.Device)
	}
}

// Stat asks the daemon holding path for its state without staging it
// (on a connection of its own, closed after).
func Stat(path string) (proto.Response, error) {
	c, rel, err := DialMount(path)
	if err != nil {
		return proto.Response{}, err
	}
	defer c.Close()
	return c.Stat(rel)
}

// mapFiles maps a grant's descriptors and closes them.
func mapFiles(g *proto.Grant, files []*os.File) (chunkmap.Mapping, error) {
	defer closeAll(files)
	return mapGrant(g, files)
}
