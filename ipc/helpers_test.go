package ipc_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/client"
	"github.com/gdsfs/gdsfs/gpu"
	"github.com/gdsfs/gdsfs/gpu/host"
	"github.com/gdsfs/gdsfs/internal/units"
	"github.com/gdsfs/gdsfs/ipc"
	"github.com/gdsfs/gdsfs/proto"
	"github.com/gdsfs/gdsfs/staging"
	"github.com/gdsfs/gdsfs/staging/triggers"
	"github.com/gdsfs/gdsfs/staging/triggers/readahead"
)

type fixture struct {
	cfg    ipc.Config // what srv was started with
	src    string
	cache  *staging.Cache
	srv    *ipc.Server
	closed chan struct{} // one value per connection whose end was accounted
}

type setup struct {
	capacity int64 // default 64 MiB
	chunk    int64 // default 64 KiB
	devices  int   // host devices (0: one, "host")
	log      *zap.Logger
	opts     func(*ipc.Options)
	before   func(*ipc.Server) // before Serve
	observe  func(op string, d time.Duration, err error)
	nodeID   func(dev, ino uint64) (uint64, bool) // ipc.Config.NodeID
}

func testOptions(sharing string) ipc.Options {
	return ipc.Options{
		Sharing: sharing, AcquireTimeout: 10 * time.Second, MaxRequest: 1024,
		MaxConnections: 96, MaxConnectionsPerUID: 48, MaxLeasesPerUID: 100000,
		MaxHeldPerUID: units.Share{Percent: 100}, IdleTimeout: time.Minute, RequestTimeout: 10 * time.Second,
	}
}

func newFixture(t *testing.T, sharing string) *fixture {
	return start(t, sharing, setup{})
}

func start(t *testing.T, sharing string, su setup) *fixture {
	t.Helper()
	if su.capacity == 0 {
		su.capacity = 64 << 20
	}
	if su.chunk == 0 {
		su.chunk = 64 << 10
	}
	dir := t.TempDir()
	os.Chmod(dir, 0o755) // other uids reach the socket and SOURCE
	os.Chmod(filepath.Dir(dir), 0o755)
	src := filepath.Join(dir, "src")
	os.Mkdir(src, 0o755)
	log := su.log
	if log == nil {
		log = zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
	}
	cache := newCache(t, src, su, log)
	o := testOptions(sharing)
	o.Socket = filepath.Join(dir, "s.sock")
	if su.opts != nil {
		su.opts(&o)
	}
	cfg := ipc.Config{Source: src, Mountpoint: "/mnt/gds", Cache: cache, Log: log, Options: o, Observe: su.observe, NodeID: su.nodeID}
	srv, err := ipc.Listen(cfg)
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{cfg: cfg, src: src, cache: cache, srv: srv, closed: make(chan struct{}, 100000)}
	ipc.OnConnClosed(srv, func() { f.closed <- struct{}{} })
	if su.before != nil {
		su.before(srv)
	}
	go srv.Serve()
	t.Cleanup(func() {
		client.DropCache()
		srv.Close()
		cache.Close()
	})
	return f
}

// newCache is a staging cache of SOURCE src on host devices (su's
// capacity, chunk and devices, which start has defaulted).
func newCache(t *testing.T, src string, su setup, log *zap.Logger) *staging.Cache {
	t.Helper()
	cache, err := staging.New(context.Background(), staging.Config{
		Source: src,
		Options: staging.Options{Device: "host", GPUs: []int{0}, Capacity: units.Share{Bytes: units.Size(su.capacity)},
			ChunkSize: units.Size(su.chunk), Prefetch: "manual", PrefetchQueue: 16, PrefetchWorkers: 1},
		Queue:     triggers.NewQueue(16, 1, log),
		AfterRead: triggers.NewAfterRead(triggers.AfterReadOptions{MapMin: triggers.SettleMapMin}),
		ReadAhead: readahead.NewExecutor(nil),
		IO:        staging.IOOptions{CompatMode: "auto", TaskSize: 64 << 10, BounceSize: 64 << 10, NumThreads: 2, DirectIO: "off"},
		Devices:   hostDevices(su.chunk, su.devices),
		Log:       log,
	})
	if err != nil {
		t.Fatal(err)
	}
	return cache
}

// hostDevices is n host devices (0 or 1: one, "host") of chunk bytes.
func hostDevices(chunk int64, n int) []gpu.Device {
	var out []gpu.Device
	for _, d := range host.OpenN(gpu.Options{ChunkSize: chunk}, n) {
		out = append(out, d)
	}
	return out
}

func (f *fixture) write(t *testing.T, rel string, data []byte) string {
	t.Helper()
	p := filepath.Join(f.src, rel)
	os.MkdirAll(filepath.Dir(p), 0o755)
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	// A new mtime each time, so a rewrite of the same size is a change
	// whatever the clock's resolution.
	mt := time.Unix(1_700_000_000+mtimes.Add(1), 0)
	os.Chtimes(p, mt, mt)
	return p
}

var mtimes atomic.Int64

// waitClosed waits until n more connections have been accounted closed.
func (f *fixture) waitClosed(t *testing.T, n int) {
	t.Helper()
	for range n {
		select {
		case <-f.closed:
		case <-time.After(10 * time.Second):
			t.Fatal("a closed connection was not accounted within 10s")
		}
	}
}

func pattern(n int, seed int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + i>>8 + seed*31)
	}
	return b
}

func leaseBytes(t *testing.T, l *client.Lease) []byte {
	t.Helper()
	b := make([]byte, l.Size())
	if _, err := l.ReadAt(b, 0); err != nil {
		t.Fatal(err)
	}
	return b
}

// raw is a plain protocol connection.
type raw struct {
	t *testing.T
	c *net.UnixConn
	r *proto.Reader
}

func dial(t *testing.T, path string) *raw {
	t.Helper()
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &raw{t: t, c: c, r: proto.NewReader(c, proto.MaxAnswer)}
}

// dialAs connects with effective uid/gid set on this thread only, so the
// daemon's SO_PEERCRED sees uid (the thread's groups come along).
func dialAs(t *testing.T, path string, uid, gid uint32) *raw {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	c, err := dialAsErr(path, uid, gid)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &raw{t: t, c: c, r: proto.NewReader(c, proto.MaxAnswer)}
}

// dialAsErr is dialAs's connect, on a thread the caller has locked.
func dialAsErr(path string, uid, gid uint32) (*net.UnixConn, error) {
	keep := ^uintptr(0)
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, keep, uintptr(gid), keep); e != 0 {
		return nil, fmt.Errorf("setresgid: %w", e)
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, keep, uintptr(uid), keep); e != 0 {
		unix.RawSyscall(unix.SYS_SETRESGID, keep, 0, keep)
		return nil, fmt.Errorf("setresuid: %w", e)
	}
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
	_, _, e1 := unix.RawSyscall(unix.SYS_SETRESUID, keep, 0, keep)
	_, _, e2 := unix.RawSyscall(unix.SYS_SETRESGID, keep, 0, keep)
	if e1 != 0 || e2 != 0 {
		panic("cannot restore the thread's identity") // never hand it back to the scheduler
	}
	return c, err
}

// do sends req and returns the answer and its descriptors (as files).
func (r *raw) do(req proto.Request) (proto.Response, []*os.File) {
	r.t.Helper()
	return r.doLine(req.Line())
}

func (r *raw) doLine(line []byte) (proto.Response, []*os.File) {
	r.t.Helper()
	r.c.Write(line) // a refused connection may be closed already: its answer waits
	return r.next()
}

func (r *raw) next() (proto.Response, []*os.File) {
	r.t.Helper()
	r.c.SetReadDeadline(time.Now().Add(20 * time.Second))
	line, fds, err := r.r.Next()
	if err != nil {
		proto.CloseFDs(fds)
		r.t.Fatalf("answer: %v", err)
	}
	resp, err := proto.DecodeResponse(line)
	if err != nil {
		r.t.Fatal(err)
	}
	files := make([]*os.File, len(fds))
	for i, fd := range fds {
		files[i] = os.NewFile(uintptr(fd), "chunk")
	}
	r.t.Cleanup(func() {
		for _, f := range files {
			f.Close()
		}
	})
	return resp, files
}

func inode(t *testing.T, f *os.File) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// needRoot skips, saying so, where the test cannot act as other users,
// give files to them or drop capabilities (make test runs as root).
func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("SKIPPED: acting as other users, giving them files and dropping capabilities needs root (run make test as root)")
	}
}
