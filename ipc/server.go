package ipc

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/gdsfs/gdsfs/internal/access"
	"github.com/gdsfs/gdsfs/staging"
)

// Cache is what the server needs from the staging cache.
type Cache interface {
	Acquire(ctx context.Context, req staging.Request) (*staging.Lease, error)
	Attr(rel string) (state, path string)
	// AbsentReason is why rel last became absent, or "" (staging.Cache).
	AbsentReason(rel string) string
	Stats() staging.Stats
	// Devices names the devices files are staged onto (hello answers them).
	Devices() []string
	// Subscribe calls fn with every entry state change (wait follows them).
	Subscribe(fn func(staging.Event)) (cancel func())
}

// Config is what Listen needs.
type Config struct {
	Source     string // SOURCE: files are opened beneath it, as the peer
	Mountpoint string // accepted as a prefix of request paths
	Options    Options
	Cache      Cache
	Log        *zap.Logger
	// Observe, when set, is called once per request answered: the op
	// ("acquire", ...; "invalid" for a line that is not a request), how
	// long the answer took, and the error answered (nil for success; it
	// has an Errno() string method).
	Observe func(op string, d time.Duration, err error)
	// NodeID, when set, is the inode number the mount shows for SOURCE's
	// inode ino of device dev, and whether the mount has given it one: an
	// acquire that asks for the identity of the file it leases gets it.
	NodeID func(dev, ino uint64) (uint64, bool)
}

// listener is what Serve accepts from (a *net.UnixListener; tests inject
// failures).
type listener interface {
	AcceptUnix() (*net.UnixConn, error)
	Close() error
}

// Server answers lease requests on a Unix socket.
//
// Lock order: mu, then nothing.
type Server struct {
	cfg   Config
	root  *access.Root
	path  string
	epoch uint64
	ln    listener
	uln   *net.UnixListener // the socket ln accepts from (Handoff passes it on)
	// unlinkAtServe: an adopted socket is unlinked at Close only once
	// this server has served (before, its predecessor may still resume).
	unlinkAtServe bool
	log           *zap.Logger
	// ctx bounds every acquire; Close cancels it so no handler outlives
	// the server waiting for a load.
	ctx    context.Context
	cancel context.CancelFunc

	heldLimit int64 // ipc.max_held_per_uid in bytes
	headroom  int64 // ipc.cache_headroom in bytes
	room      roomCache
	reports   reports

	nextLease                     atomic.Uint64
	conns, requests, bad, denied  atomic.Uint64
	acceptErrs, timeouts, refused atomic.Uint64

	mu     sync.Mutex
	active map[*conn]bool  // guarded by mu
	uids   map[uint32]*use // guarded by mu; entries with nothing in use are removed
	total  use             // guarded by mu; INVARIANT: the sum of uids
	closed bool            // guarded by mu
	// changed is closed (and replaced) whenever total changes: wait_stat
	// waits on it. Guarded by mu.
	changed chan struct{}
	// heldQueue: per uid, the requests waiting for room under
	// ipc.max_held_per_uid, oldest first (heldwait.go). Guarded by mu.
	heldQueue map[uint32]*heldLine
	wg        sync.WaitGroup
	// Hand-over (handover.go). While paused, every goroutine that serves
	// (the accept loop, one per connection) parks before it reads or
	// answers anything more; busy counts those not parked, and idle is
	// signalled as it drops. resumed is closed to wake the parked (by
	// Resume, Abandon or Close). adopted: connections a predecessor
	// handed over, served from Serve on. All guarded by mu.
	paused, abandoned bool
	busy              int
	idle              *sync.Cond
	resumed           chan struct{}
	adopted           []*conn
	// reqCtx bounds every request's waits: Handoff cancels it (cause
	// errHandedOff) so a request blocked in one is cut and handed over.
	// Guarded by mu.
	reqCtx    context.Context
	reqCancel context.CancelCauseFunc

	onClosed  func() // tests: called after a connection's end is accounted
	onWaiting func() // tests: called each time a wait blocks
}

// use is what one uid (or everyone) has open.
type use struct {
	conns  int
	leases int   // lease ids granted and not released
	bytes  int64 // device bytes handed out over open connections
	files  int   // files held by open connections
	hold   int   // connections holding at least one file
}

// Listen binds the socket (ipc.socket, or DefaultSocket) and returns a
// server ready to Serve.
func Listen(cfg Config) (*Server, error) {
	s, err := newServer(cfg)
	if err != nil {
		return nil, err
	}
	ln, err := listen(s.path)
	if err != nil {
		s.root.Close()
		return nil, fmt.Errorf("ipc.socket %s: %w", s.path, err)
	}
	var b [8]byte
	rand.Read(b[:])
	s.setListener(ln, binary.LittleEndian.Uint64(b[:])|1)
	return s, nil
}

// newServer is a server of cfg without its socket (setListener).
func newServer(cfg Config) (*Server, error) {
	if err := cfg.Options.Validate(); err != nil {
		return nil, err
	}
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	root, err := access.OpenRoot(cfg.Source)
	if err != nil {
		return nil, fmt.Errorf("ipc: SOURCE: %w", err)
	}
	path := cfg.Options.Socket
	if path == "" {
		path = DefaultSocket(cfg.Mountpoint)
	}
	capacity := cfg.Cache.Stats().CapacityBytes
	s := &Server{
		cfg: cfg, root: root, path: path,
		log: cfg.Log.Named("ipc"), active: map[*conn]bool{}, uids: map[uint32]*use{}, changed: make(chan struct{}),
		heldQueue: map[uint32]*heldLine{},
		heldLimit: cfg.Options.MaxHeldPerUID.Resolve(capacity),
		headroom:  cfg.Options.CacheHeadroom.Resolve(capacity),
	}
	s.idle = sync.NewCond(&s.mu)
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.reqCtx, s.reqCancel = context.WithCancelCause(s.ctx)
	return s, nil
}

func (s *Server) setListener(ln *net.UnixListener, epoch uint64) {
	s.ln, s.uln, s.epoch = ln, ln, epoch
}

func fnv64(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}

// Path is the socket's path.
func (s *Server) Path() string { return s.path }

// Epoch identifies this daemon instance in every answer.
func (s *Server) Epoch() uint64 { return s.epoch }

// Serve accepts connections until Close. An Accept error (EMFILE,
// ECONNABORTED, ...) is logged and retried after a back-off that doubles
// from 5ms to 1s, so leasing resumes once the cause is gone. An adopted
// server starts serving the connections it adopted here too.
func (s *Server) Serve() {
	s.mu.Lock()
	s.busy++
	if s.unlinkAtServe {
		s.uln.SetUnlinkOnClose(true)
	}
	s.nonblockLocked() // adopted descriptors may have been sent since
	for _, cn := range s.adopted {
		s.wg.Add(1)
		s.busy++
		go cn.serve()
	}
	s.adopted = nil
	s.mu.Unlock()
	defer s.done()
	var delay time.Duration
	for s.accepting() {
		c, err := s.ln.AcceptUnix()
		if err != nil {
			if s.isClosed() {
				return
			}
			if errors.Is(err, os.ErrDeadlineExceeded) {
				continue // Handoff stopped the accept (accepting parks)
			}
			s.acceptErrs.Add(1)
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			s.log.Warn("accept failed; retrying", zap.Error(err), zap.Duration("after", delay))
			select {
			case <-time.After(delay):
			case <-s.ctx.Done():
				return
			}
			continue
		}
		delay = 0
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.Close()
			return
		}
		s.wg.Add(1)
		s.busy++
		s.mu.Unlock()
		s.conns.Add(1)
		go s.serveConn(c)
	}
}

// done is the end of a goroutine that served: it no longer counts as busy.
func (s *Server) done() {
	s.mu.Lock()
	s.busy--
	s.idle.Broadcast()
	s.mu.Unlock()
}

func (s *Server) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// Close stops accepting, closes every connection (ending what it held),
// waits for the handlers and removes the socket.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.cancel()
	s.wakeParkedLocked()
	err := s.ln.Close()
	for cn := range s.active {
		cn.c.Close()
	}
	unserved := s.adopted // adopted, never served: no goroutine ends them
	s.adopted = nil
	s.mu.Unlock()
	for _, cn := range unserved {
		cn.close()
	}
	s.wg.Wait()
	s.root.Close()
	return err
}
