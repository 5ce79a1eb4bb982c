package client

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"

	"github.com/gdsfs/gdsfs/ipc"
)

// mapping is a consumer's view of the chunks: CUDA or host.
type mapping interface {
	Ptr() uint64
	ReadAt(p []byte, off int64) (int, error)
	Close() error
}

// Lease is a staged file mapped into this process. It pins the file in the
// daemon's cache until Close.
type Lease struct {
	conn  *Conn
	id    uint64
	epoch uint64
	resp  ipc.Response
	m     mapping
	once  sync.Once
	err   error
}

// Open leases and maps the staged bytes of path, a file under a gdsfs
// mount, staging it first if needed. Leases share one connection per daemon
// in this process (it ends them all if the process dies); where a file's
// mount and socket were found is remembered per directory.
func Open(path string) (*Lease, error) {
	fresh := false
	for {
		socket, rel, remembered, err := locateCached(path)
		if err != nil {
			return nil, err
		}
		c, reused, err := sharedConn(socket, fresh)
		dialFailed := err != nil
		var l *Lease
		if err == nil {
			l, err = c.Acquire(rel)
		}
		if err == nil {
			return l, nil
		}
		// Only a failure to reach the daemon is worth a second look: a
		// remembered socket that is gone, or a shared connection that broke
		// (the daemon restarted, the mount moved). Any other error leaves
		// the connection, and the other leases on it, alone.
		stale := (dialFailed && remembered) || (!dialFailed && reused && c.broken())
		if !fresh && stale {
			forget(socket)
			fresh = true
			continue
		}
		return nil, err
	}
}

// shared holds this process's connections and where files were found.
var shared struct {
	sync.Mutex
	conns   map[string]*Conn     // by socket path
	located map[string][2]string // directory -> socket, directory relative to the mount
}

func sharedConn(socket string, fresh bool) (*Conn, bool, error) {
	shared.Lock()
	defer shared.Unlock()
	if c := shared.conns[socket]; c != nil && !fresh && !c.broken() {
		return c, true, nil
	}
	c, err := Dial(socket)
	if err != nil {
		return nil, false, err
	}
	if shared.conns == nil {
		shared.conns = map[string]*Conn{}
	}
	shared.conns[socket] = c
	return c, false, nil
}

// forget drops what is remembered about socket: the places found through
// it, and its connection if it broke (a working one keeps its leases).
func forget(socket string) {
	shared.Lock()
	defer shared.Unlock()
	if c := shared.conns[socket]; c != nil && c.broken() {
		c.Close()
		delete(shared.conns, socket)
	}
	shared.located = nil
}

func locateCached(path string) (socket, rel string, remembered bool, err error) {
	if os.Getenv("GDSFS_SOCKET") != "" {
		socket, rel, err = Locate(path)
		return socket, rel, false, err
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", "", false, err
	}
	dir, base := filepath.Split(abs)
	shared.Lock()
	hit, ok := shared.located[dir]
	shared.Unlock()
	if ok {
		return hit[0], filepath.Join(hit[1], base), true, nil
	}
	socket, rel, err = Locate(path)
	if err != nil {
		return "", "", false, err
	}
	shared.Lock()
	if shared.located == nil || len(shared.located) > 4096 {
		shared.located = map[string][2]string{}
	}
	shared.located[dir] = [2]string{socket, filepath.Dir(rel)}
	shared.Unlock()
	return socket, rel, false, nil
}

// Acquire leases path (relative to the mount, or absolute under it) on c
// and maps it.
func (c *Conn) Acquire(path string) (*Lease, error) {
	resp, files, err := c.roundTrip(ipc.Request{Op: ipc.OpAcquire, Path: path})
	if err != nil {
		return nil, err
	}
	defer closeAll(files)
	l := &Lease{conn: c, id: resp.Lease, epoch: resp.Epoch, resp: resp}
	if len(files) != len(resp.Chunks) {
		l.release()
		return nil, fmt.Errorf("gdsfs acquire %s: %d descriptors for %d chunks", path, len(files), len(resp.Chunks))
	}
	lens := make([]int64, len(resp.Chunks))
	for i, ch := range resp.Chunks {
		lens[i] = ch.Len
	}
	l.m, err = mapChunks(resp.Device, files, lens, resp.Size)
	if err != nil {
		l.release()
		return nil, fmt.Errorf("gdsfs acquire %s: map: %w", path, err)
	}
	return l, nil
}

// Ptr is the CUDA device pointer of the first byte (GPU), or the address of
// the read-only host mapping (host backend).
func (l *Lease) Ptr() uint64 { return l.m.Ptr() }

// Size is the file size in bytes.
func (l *Lease) Size() int64 { return l.resp.Size }

// Device is "GPU-<uuid>" or "host".
func (l *Lease) Device() string { return l.resp.Device }

// Generation changes when the daemon re-stages the file.
func (l *Lease) Generation() uint64 { return l.resp.Generation }

// ReadAt copies staged bytes into p (device to host on a GPU).
func (l *Lease) ReadAt(p []byte, off int64) (int, error) { return l.m.ReadAt(p, off) }

// Close unmaps and releases the lease. If the daemon that granted it is
// gone, the mapping is still undone and the error says the lease ended
// with that daemon (ESTALE).
func (l *Lease) Close() error {
	l.once.Do(func() {
		if l.m != nil {
			l.err = l.m.Close()
		}
		if err := l.release(); err != nil && l.err == nil {
			l.err = err
		}
	})
	return l.err
}

func (l *Lease) release() error {
	_, _, err := l.conn.roundTrip(ipc.Request{Op: ipc.OpRelease, Lease: l.id, Epoch: l.epoch})
	var ce *Error
	if err != nil && !errors.As(err, &ce) {
		return &Error{Errno: syscall.ESTALE, Msg: fmt.Sprintf("lease %d ended with its daemon (epoch %d): %v", l.id, l.epoch, err)}
	}
	return err
}
