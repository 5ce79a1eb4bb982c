package staging

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/gpu"
	"github.com/gdsfs/gdsfs/gpu/host"
	"github.com/gdsfs/gdsfs/internal/testkit/testfiles"
	"github.com/gdsfs/gdsfs/internal/units"
	"github.com/gdsfs/gdsfs/staging/triggers"
	"github.com/gdsfs/gdsfs/staging/triggers/readahead"
)

// fakeDevice is the host backend with hooks (function fields) to inject
// failures and to hold loads at a point the test chooses.
type fakeDevice struct {
	*host.Device
	allocs   atomic.Int32
	alloc    func(size int64) (gpu.Region, error) // nil: the host's
	copyHook func() error                         // called on every CopyAsync; its error fails the copy
	copyTo   func(dst gpu.Region, off int64)      // called on every CopyAsync with where it copies to
	waitHook func(i int) error                    // called on every Wait; its error is the copy's
	cufile   gpu.CuFile                           // nil: no cuFile
	copy     func(dst, src gpu.Region) error      // nil: the host's Copy
}

func (d *fakeDevice) Copy(dst, src gpu.Region) error {
	if d.copy != nil {
		return d.copy(dst, src)
	}
	return d.Device.Copy(unwrap(dst), unwrap(src))
}

// fakeRegion is a host region that counts its Frees and can fail them.
type fakeRegion struct {
	gpu.Region
	frees    atomic.Int32
	freeFail error // returned by the first Free (which still frees)
}

func (r *fakeRegion) Free() error {
	if r.frees.Add(1) == 1 {
		err := r.Region.Free()
		if r.freeFail != nil {
			return r.freeFail
		}
		return err
	}
	return errors.New("region freed twice")
}

func unwrap(r gpu.Region) gpu.Region {
	if f, ok := r.(*fakeRegion); ok {
		return f.Region
	}
	return r
}

func newFake(chunk int64) *fakeDevice {
	return &fakeDevice{Device: host.Open(gpu.Options{ChunkSize: chunk})}
}

func (d *fakeDevice) Alloc(size int64) (gpu.Region, error) {
	d.allocs.Add(1)
	if d.alloc != nil {
		return d.alloc(size)
	}
	return d.Device.Alloc(size)
}

func (d *fakeDevice) NewWorker(n int) (gpu.Worker, error) {
	w, err := d.Device.NewWorker(n)
	if err != nil {
		return nil, err
	}
	return &fakeWorker{Worker: w, d: d}, nil
}

func (d *fakeDevice) CuFile() (gpu.CuFile, string) {
	if d.cufile == nil {
		return nil, "fake device without cuFile"
	}
	return d.cufile, ""
}

type fakeWorker struct {
	gpu.Worker
	d *fakeDevice
}

func (w *fakeWorker) Wait(i int) error {
	err := w.Worker.Wait(i)
	if w.d.waitHook != nil {
		if herr := w.d.waitHook(i); herr != nil {
			return herr
		}
	}
	return err
}

func (w *fakeWorker) CopyAsync(dst gpu.Region, off int64, i, n int) error {
	if w.d.copyTo != nil {
		w.d.copyTo(dst, off)
	}
	if w.d.copyHook != nil {
		if err := w.d.copyHook(); err != nil {
			return err
		}
	}
	return w.Worker.CopyAsync(unwrap(dst), off, i, n)
}

// fakeCuFile "reads" by pread plus a host copy, and refuses to register
// when refuse is set. It records whether it was handed O_DIRECT
// descriptors.
type fakeCuFile struct {
	d      *fakeDevice
	mode   string // "" is compat
	refuse error
	reads  atomic.Int32
	direct atomic.Int32 // registrations of an O_DIRECT descriptor
	plain  atomic.Int32 // registrations of a buffered one
}

func (f *fakeCuFile) Mode() string {
	if f.mode == "" {
		return "compat"
	}
	return f.mode
}

func (f *fakeCuFile) Register(fd int) (gpu.CuFileHandle, error) {
	if f.refuse != nil {
		return nil, f.refuse
	}
	fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
	if err != nil {
		return nil, err
	}
	if fl&unix.O_DIRECT != 0 {
		f.direct.Add(1)
	} else {
		f.plain.Add(1)
	}
	return &fakeHandle{f: f, fd: fd, direct: fl&unix.O_DIRECT != 0}, nil
}

type fakeHandle struct {
	f      *fakeCuFile
	fd     int
	direct bool
}

func (h *fakeHandle) ReadInto(dst gpu.Region, dstOff, fileOff int64, n int) (int, error) {
	h.f.reads.Add(1)
	want := n
	if h.direct { // whole pages, as O_DIRECT wants; the file's end stops it short
		want = int(gpu.RoundUp(int64(n), 4096))
	}
	w, err := h.f.d.Device.NewWorker(want)
	if err != nil {
		return 0, err
	}
	defer w.Close()
	k, err := unix.Pread(h.fd, w.Buffer(0)[:want], fileOff)
	if err != nil {
		return 0, err
	}
	k = min(k, n)
	if err := w.CopyAsync(unwrap(dst), dstOff, 0, k); err != nil {
		return 0, err
	}
	return k, w.Wait(0)
}

func (h *fakeHandle) Close() error { return nil }

// testOptions are small: 4 KiB granules, 64 KiB tasks.
func testOptions() (Options, IOOptions) {
	return Options{
			Device: DeviceHost, GPUs: []int{0}, Capacity: units.Share{Bytes: 1 << 30},
			ChunkSize: 1 << 20, Prefetch: PrefetchOpen, PrefetchQueue: 64, PrefetchWorkers: 2,
			Watch: WatchAuto, RacyWindow: 2 * time.Second, DeferWhileRead: true, DeferLimit: time.Minute,
		}, IOOptions{
			CompatMode: CompatAuto, GDSThreshold: 0, TaskSize: 64 << 10, BounceSize: 16 << 10, NumThreads: 4, DirectIO: DirectOff,
		}
}

func newCache(t *testing.T, src string, opts Options, io IOOptions, devs ...gpu.Device) *Cache {
	return newCacheCfg(t, Config{Source: src, Options: opts, IO: io, Devices: devs})
}

// newCacheCfg is newCache with the whole Config (Devices: a fake when empty).
func newCacheCfg(t *testing.T, cfg Config) *Cache {
	t.Helper()
	if len(cfg.Devices) == 0 {
		cfg.Devices = []gpu.Device{newFake(int64(cfg.Options.ChunkSize))}
	}
	cfg.Log = zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel))
	if cfg.Queue == nil {
		cfg.Queue = newQueue(cfg.Options, cfg.Log)
	}
	if cfg.AfterRead == nil {
		cfg.AfterRead = newAfterRead(cfg.Options, nil) // as the daemon wires it
	}
	if cfg.ReadAhead == nil {
		cfg.ReadAhead = readahead.NewExecutor(nil) // as the daemon wires it
	}
	c, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.lock()
		c.checkInvariantsLocked()
		c.unlock()
		c.Close()
	})
	return c
}

// newPlainCache is a cache made as tools/bench makes its caches: no
// prefetch queue, no staging after reads, no read-ahead executor.
func newPlainCache(t *testing.T, src string, opts Options, io IOOptions) *Cache {
	t.Helper()
	c, err := New(context.Background(), Config{Source: src, Options: opts, IO: io,
		Devices: []gpu.Device{newFake(int64(opts.ChunkSize))}, Log: zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// newAfterRead is the staging after reads the daemon wires in, for opts;
// edit, when set, changes its options first.
func newAfterRead(opts Options, edit func(*triggers.AfterReadOptions)) *triggers.AfterRead {
	o := triggers.AfterReadOptions{DeferLimit: opts.DeferLimit, MapMin: triggers.SettleMapMin}
	if edit != nil {
		edit(&o)
	}
	return triggers.NewAfterRead(o)
}

// newQueue is the prefetch queue the daemon wires in, sized by opts.
func newQueue(opts Options, log *zap.Logger) Queue {
	return triggers.NewQueue(opts.PrefetchQueue, opts.PrefetchWorkers, log)
}

// regionBytes reads a region back through ReadAt.
func regionBytes(t *testing.T, r gpu.Region) []byte {
	t.Helper()
	b := make([]byte, r.Size())
	if _, err := r.ReadAt(b, 0); err != nil {
		t.Fatal(err)
	}
	return b
}

// checkStaged leases rel and compares its bytes with want.
func checkStaged(t *testing.T, c *Cache, rel string, want []byte) {
	t.Helper()
	l, err := c.Acquire(context.Background(), Request{Rel: rel})
	if err != nil {
		t.Fatalf("acquire %s: %v", rel, err)
	}
	defer l.Release()
	if got := regionBytes(t, l.Region()); !bytes.Equal(got, want) {
		t.Fatalf("%s: staged bytes differ from the file", rel)
	}
}

// recorder keeps every event a cache delivered since it subscribed.
type recorder struct {
	mu     sync.Mutex
	events []Event
	all    []Event       // every event, in order
	more   chan struct{} // capacity 1: an event arrived
	cancel func()
}

// record subscribes to c's events for the rest of the test.
func record(t *testing.T, c *Cache) *recorder {
	r := &recorder{more: make(chan struct{}, 1)}
	cancel := c.Subscribe(func(e Event) {
		r.mu.Lock()
		r.events = append(r.events, e)
		r.all = append(r.all, e)
		r.mu.Unlock()
		select {
		case r.more <- struct{}{}:
		default:
		}
	})
	r.cancel = cancel
	t.Cleanup(cancel)
	return r
}

// waitFor waits for the earliest event for rel in state not returned yet,
// and returns it.
// The deadline only turns a hang into a failure.
func (r *recorder) waitFor(t *testing.T, rel, state string) Event {
	t.Helper()
	timeout := time.After(20 * time.Second)
	for {
		r.mu.Lock()
		for i, e := range r.events {
			if e.Rel == rel && e.State == state {
				r.events = append(r.events[:i:i], r.events[i+1:]...)
				r.mu.Unlock()
				return e
			}
		}
		r.mu.Unlock()
		select {
		case <-r.more:
		case <-timeout:
			t.Fatalf("no %s event for %s", state, rel)
		}
	}
}

var (
	randomBytes = testfiles.RandomBytes
	writeFile   = testfiles.WriteFile
	mapFile     = testfiles.MapFile
)
