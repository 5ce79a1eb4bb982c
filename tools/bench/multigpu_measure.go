package bench

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"syscall"
	"time"

	"github.com/gdsfs/gdsfs/daemon/config"
	"github.com/gdsfs/gdsfs/gpu"
	"github.com/gdsfs/gdsfs/staging"
)

// mgRow is one figure of `bench multigpu`: a rate (GB/s) and the time it
// took, or why it could not be measured.
type mgRow struct {
	Name    string  `json:"name"`
	GBps    float64 `json:"gbps,omitempty"`
	Seconds float64 `json:"seconds,omitempty"`
	Why     string  `json:"unavailable,omitempty"`
	Detail  string  `json:"detail,omitempty"`
}

func (r mgRow) String() string {
	if r.Why != "" {
		return fmt.Sprintf("%-58s unavailable: %s", r.Name, r.Why)
	}
	s := fmt.Sprintf("%-58s %8s GB/s %8.3f s", r.Name, num(r.GBps), r.Seconds)
	if r.Detail != "" {
		s += "  (" + r.Detail + ")"
	}
	return s
}

// best runs fn runs times and keeps the shortest time; bytes is what one
// run moves.
func best(name string, runs int, bytes int64, fn func() (time.Duration, error)) mgRow {
	r := mgRow{Name: name}
	var least time.Duration
	for range runs {
		d, err := fn()
		if err != nil {
			r.Why = err.Error()
			return r
		}
		if least == 0 || d < least {
			least = d
		}
	}
	r.Seconds, r.GBps = least.Seconds(), gbps(bytes, least)
	return r
}

// h2dCopy copies total bytes from two pinned 512 MiB bounce buffers in
// turn into a region of dev (the pinned host-to-device rate; a memcpy on
// the host backend) and returns how long the copies took (not the
// allocations).
func h2dCopy(dev gpu.Device, total int64) (time.Duration, error) {
	run, done, err := h2dPrepare(dev, total)
	if err != nil {
		return 0, err
	}
	defer done()
	return run()
}

// h2dPrepare allocates what h2dCopy copies with; run times the copies.
func h2dPrepare(dev gpu.Device, total int64) (run func() (time.Duration, error), done func(), err error) {
	const buf = 512 << 20
	r, err := dev.Alloc(total)
	if err != nil {
		return nil, nil, err
	}
	w, err := dev.NewWorker(buf)
	if err != nil {
		r.Free()
		return nil, nil, err
	}
	run = func() (time.Duration, error) {
		start := time.Now()
		var err error
		for k := 0; k < int(total/buf) && err == nil; k++ {
			if err = w.Wait(k & 1); err == nil {
				err = w.CopyAsync(r, int64(k)*buf, k&1, buf)
			}
		}
		err = errors.Join(err, w.Wait(0), w.Wait(1))
		return time.Since(start), err
	}
	return run, func() { w.Close(); r.Free() }, nil
}

// h2dBoth is h2dCopy on every device at once: the wall time from the
// moment every device's buffers are allocated until the last copy ends.
func h2dBoth(devs []gpu.Device, total int64) (time.Duration, error) {
	runs := make([]func() (time.Duration, error), len(devs))
	for i, d := range devs {
		run, done, err := h2dPrepare(d, total)
		if err != nil {
			return 0, err
		}
		defer done()
		runs[i] = run
	}
	errs := make([]error, len(devs))
	var wg sync.WaitGroup
	start := time.Now()
	for i, run := range runs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = run()
		}()
	}
	wg.Wait()
	return time.Since(start), errors.Join(errs...)
}

// peerCopy copies n bytes from a region of src to one of dst device to
// device (gpu.Peer.CopyRange on dst), once untimed, then timed.
func peerCopy(src, dst gpu.Device, n int64) (func() (time.Duration, error), func(), error) {
	p, ok := dst.(gpu.Peer)
	if !ok {
		return nil, nil, fmt.Errorf("%s copies no regions device to device", dst.Name())
	}
	if ok, why := p.PeerAccess(src); !ok {
		return nil, nil, fmt.Errorf("no peer access %s -> %s: %s", src.Name(), dst.Name(), why)
	}
	a, err := src.Alloc(n)
	if err != nil {
		return nil, nil, err
	}
	b, err := dst.Alloc(n)
	if err != nil {
		a.Free()
		return nil, nil, err
	}
	timed := func() (time.Duration, error) {
		start := time.Now()
		err := p.CopyRange(b, 0, a, 0, n)
		return time.Since(start), err
	}
	_, err = timed()
	return timed, func() { a.Free(); b.Free() }, err
}

// hostMemcpy is the host memory bandwidth: n bytes copied between two
// buffers by one goroutine per CPU (up to 32), as the POSIX path's readers
// copy from the page cache into bounce buffers.
func hostMemcpy(n int64) func() (time.Duration, error) {
	src, dst := make([]byte, n), make([]byte, n)
	for i := range src {
		src[i] = byte(i)
	}
	threads := min(runtime.NumCPU(), 32)
	share := (n + int64(threads) - 1) / int64(threads)
	run := func() (time.Duration, error) {
		var wg sync.WaitGroup
		start := time.Now()
		for off := int64(0); off < n; off += share {
			wg.Add(1)
			go func() {
				defer wg.Done()
				end := min(off+share, n)
				copy(dst[off:end], src[off:end])
			}()
		}
		wg.Wait()
		return time.Since(start), nil
	}
	run() // fault the pages in
	return run
}

// mgCache is a staging cache over the bench's files on every device.
type mgCache struct {
	c    *staging.Cache
	devs []string // device names, staging.gpus order
	rels []string // the files, evicted before each timed run
}

func newMGCache(cfg *config.Config, devs []gpu.Device, dir, peerCopy string, rels []string) (*mgCache, error) {
	o := cfg.Staging
	o.PeerCopy = peerCopy
	c, err := staging.New(context.Background(), staging.Config{Source: dir, Options: o, IO: cfg.IO, Devices: devs})
	if err != nil {
		return nil, err
	}
	m := &mgCache{c: c, rels: rels}
	for _, d := range devs {
		m.devs = append(m.devs, d.Name())
	}
	return m, nil
}

// clear evicts every replica of the files.
func (m *mgCache) clear() error {
	for _, rel := range m.rels {
		if err := m.c.Evict(rel); err != nil && !errors.Is(err, syscall.ENOENT) {
			return err
		}
	}
	return nil
}

// timed clears the cache, then times steps run one after the other; each
// step runs its stagings at once (a file on devices each).
func (m *mgCache) timed(ctx context.Context, steps ...[]stageJob) (time.Duration, error) {
	if err := m.clear(); err != nil {
		return 0, err
	}
	start := time.Now()
	for _, jobs := range steps {
		errs := make([]error, len(jobs))
		var wg sync.WaitGroup
		for i, j := range jobs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, errs[i] = m.c.StageOn(ctx, j.rel, j.devs)
			}()
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return 0, err
		}
	}
	return time.Since(start), nil
}

func (m *mgCache) close() {
	m.clear()
	m.c.Close()
}

// stageJob is one StageOn: a file onto devices.
type stageJob struct {
	rel  string
	devs []string
}

func on(rel string, devs ...string) []stageJob { return []stageJob{{rel, devs}} }
