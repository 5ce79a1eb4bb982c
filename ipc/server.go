package ipc

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"

	"go.uber.org/zap"

	"github.com/gdsfs/gdsfs/staging"
)

// Cache is what the server needs from the staging cache.
type Cache interface {
	Acquire(ctx context.Context, req staging.Request) (*staging.Lease, error)
	Attr(rel string) (state, path string)
}

// Config is what Listen needs.
type Config struct {
	Source     string // SOURCE, for permission checks
	Mountpoint string // accepted as a prefix of request paths
	Options    Options
	Cache      Cache
	Log        *zap.Logger
}

// Stats are the server's counters.
type Stats struct {
	Connections uint64 `json:"ipc_connections"`
	Requests    uint64 `json:"ipc_requests"`
	BadRequests uint64 `json:"ipc_bad_requests"`
	LeaseDenied uint64 `json:"lease_denied"`
}

// Server answers lease requests on a Unix socket.
type Server struct {
	cfg   Config
	path  string
	epoch uint64
	ln    *net.UnixListener
	log   *zap.Logger
	// ctx bounds every acquire; Close cancels it so no handler outlives
	// the server waiting for a load.
	ctx    context.Context
	cancel context.CancelFunc

	nextLease                    atomic.Uint64
	conns, requests, bad, denied atomic.Uint64

	mu     sync.Mutex
	active map[*net.UnixConn]bool // guarded by mu
	closed bool                   // guarded by mu
	wg     sync.WaitGroup
}

// Listen binds the socket (ipc.socket, or DefaultSocket) and returns a
// server ready to Serve.
func Listen(cfg Config) (*Server, error) {
	if err := cfg.Options.Validate(); err != nil {
		return nil, err
	}
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	path := cfg.Options.Socket
	if path == "" {
		path = DefaultSocket(cfg.Mountpoint)
	}
	ln, err := listen(path)
	if err != nil {
		return nil, fmt.Errorf("ipc.socket %s: %w", path, err)
	}
	var b [8]byte
	rand.Read(b[:])
	s := &Server{
		cfg: cfg, path: path, epoch: binary.LittleEndian.Uint64(b[:]) | 1, ln: ln,
		log: cfg.Log.Named("ipc"), active: map[*net.UnixConn]bool{},
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	return s, nil
}

func listen(path string) (*net.UnixListener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	if _, err := os.Lstat(path); err == nil {
		if c, err := net.Dial("unix", path); err == nil {
			c.Close()
			return nil, errors.New("in use by another daemon")
		}
		os.Remove(path) // left by a daemon that died
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, err
	}
	ln.SetUnlinkOnClose(true)
	// Anyone may connect; each request is checked against the file's
	// permissions with the peer's credentials.
	if err := os.Chmod(path, 0o666); err != nil {
		ln.Close()
		return nil, err
	}
	return ln, nil
}

// DefaultSocket is /run/gdsfs/<hash of mountpoint>.sock, or under
// $XDG_RUNTIME_DIR or the temp directory when /run/gdsfs is not writable.
func DefaultSocket(mountpoint string) string {
	name := fmt.Sprintf("%016x.sock", fnv64(mountpoint))
	for _, dir := range []string{"/run/gdsfs", os.Getenv("XDG_RUNTIME_DIR")} {
		if dir == "" {
			continue
		}
		if err := os.MkdirAll(dir, 0o755); err == nil && writable(dir) {
			return filepath.Join(dir, name)
		}
	}
	return filepath.Join(os.TempDir(), fmt.Sprintf("gdsfs-%d", os.Geteuid()), name)
}

func writable(dir string) bool {
	f, err := os.CreateTemp(dir, ".probe")
	if err != nil {
		return false
	}
	f.Close()
	os.Remove(f.Name())
	return true
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

// Serve accepts connections until Close.
func (s *Server) Serve() {
	for {
		c, err := s.ln.AcceptUnix()
		if err != nil {
			s.mu.Lock()
			closed := s.closed
			s.mu.Unlock()
			if !closed {
				s.log.Error("accept", zap.Error(err))
			}
			return
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.Close()
			return
		}
		s.active[c] = true
		s.wg.Add(1)
		s.mu.Unlock()
		s.conns.Add(1)
		go s.serveConn(c)
	}
}

// Close stops accepting, closes every connection (ending its leases),
// waits for the handlers and removes the socket.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.cancel()
	err := s.ln.Close()
	for c := range s.active {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return err
}

// Stats returns the counters.
func (s *Server) Stats() Stats {
	return Stats{
		Connections: s.conns.Load(), Requests: s.requests.Load(),
		BadRequests: s.bad.Load(), LeaseDenied: s.denied.Load(),
	}
}
