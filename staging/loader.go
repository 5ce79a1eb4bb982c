package staging

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/gpu"
)

// fill loads f into region by the path the options and the platform allow.
// It returns the path taken and, when that is not cuFile although cuFile
// exists, why.
func (c *Cache) fill(e *entry, f *os.File, region gpu.Region) (path, note string, err error) {
	dev := e.slot.dev
	posix := PathPOSIX
	if dev.Kind() == gpu.KindHost {
		posix = PathHost
	}
	cf, why := dev.CuFile()
	switch {
	case c.io.CompatMode == CompatOn:
		note = "io.compat_mode is on"
	case cf == nil && c.io.CompatMode == CompatOff:
		return PathCuFile, "", fmt.Errorf("io.compat_mode is off and cuFile is unavailable: %s", why)
	case cf == nil:
		note = "cuFile unavailable: " + why
	case c.io.CompatMode == CompatAuto && e.id.size < int64(c.io.GDSThreshold):
		note = fmt.Sprintf("smaller than io.gds_threshold (%s)", c.io.GDSThreshold)
	default:
		h, rerr := cf.Register(int(f.Fd()))
		if rerr == nil {
			defer h.Close()
			return PathCuFile, "", e.slot.loader.run(&job{region: region, size: e.id.size, cf: h})
		}
		if c.io.CompatMode == CompatOff {
			return PathCuFile, "", fmt.Errorf("io.compat_mode is off: %w", rerr)
		}
		note = rerr.Error()
		c.stats.cufileFallbacks.Add(1)
		c.stats.setCuFileError(note)
	}
	j := &job{region: region, size: e.id.size, f: f}
	if c.io.DirectIO {
		if df, derr := c.open(e.rel, os.O_RDONLY|syscall.O_DIRECT); derr == nil {
			defer df.Close()
			j.f, j.direct = df, true
		} else {
			note = joinNote(note, "O_DIRECT refused, buffered reads: "+derr.Error())
		}
	}
	return posix, note, e.slot.loader.run(j)
}

func joinNote(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

// job is one file's load: its tasks run on the slot's workers.
type job struct {
	region gpu.Region
	size   int64
	f      *os.File         // POSIX path
	direct bool             // f has O_DIRECT
	cf     gpu.CuFileHandle // cuFile path when not nil
	wg     sync.WaitGroup   // one per task
	failed atomic.Bool      // a task failed: skip the rest
	errMu  sync.Mutex       // guards err
	err    error            // the first task error
}

func (j *job) finish(err error) {
	if err != nil {
		j.errMu.Lock()
		if j.err == nil {
			j.err = err
		}
		j.errMu.Unlock()
		j.failed.Store(true)
	}
	j.wg.Done()
}

type task struct {
	j   *job
	off int64
	n   int
}

// loader runs tasks on io.num_threads workers, each owning a gpu.Worker
// (stream and two bounce buffers) created on first use.
type loader struct {
	c     *Cache
	slot  *slot
	tasks chan task // unbuffered: a sent task is always finished by a worker
	once  sync.Once
}

func newLoader(c *Cache, s *slot) *loader {
	return &loader{c: c, slot: s, tasks: make(chan task)}
}

// run splits j into tasks and waits for all of them.
func (l *loader) run(j *job) error {
	l.once.Do(func() {
		for range l.c.io.NumThreads {
			l.c.wg.Add(1)
			go l.work()
		}
	})
	ts := int64(l.c.io.TaskSize)
	for off := int64(0); off < j.size; off += ts {
		j.wg.Add(1)
		select {
		case l.tasks <- task{j: j, off: off, n: int(min(ts, j.size-off))}:
		case <-l.c.ctx.Done():
			j.finish(fmt.Errorf("cache closing: %w", l.c.ctx.Err()))
			off = j.size
		}
	}
	j.wg.Wait()
	return j.err
}

func (l *loader) close() {}

// work is one worker: it reads a task into one bounce buffer while the
// other buffer's copy to the device is in flight.
func (l *loader) work() {
	defer l.c.wg.Done()
	var w gpu.Worker
	var pending [2]*task
	next := 0
	flush := func() {
		for i, p := range pending {
			if p != nil {
				p.j.finish(w.Wait(i))
				pending[i] = nil
			}
		}
	}
	defer func() {
		if w != nil {
			flush()
			w.Close()
		}
	}()
	for {
		var t task
		select {
		case t = <-l.tasks:
		default:
			if w != nil {
				flush() // idle: complete copies before blocking
			}
			select {
			case t = <-l.tasks:
			case <-l.c.ctx.Done():
				return
			}
		}
		switch {
		case t.j.failed.Load():
			t.j.finish(nil)
			continue
		case t.j.cf != nil:
			t.j.finish(t.readCuFile())
			continue
		}
		if w == nil {
			var err error
			if w, err = l.slot.dev.NewWorker(int(l.c.io.TaskSize)); err != nil {
				w = nil
				t.j.finish(fmt.Errorf("bounce buffers: %w", err))
				continue
			}
		}
		i := next
		next ^= 1
		if p := pending[i]; p != nil {
			p.j.finish(w.Wait(i))
			pending[i] = nil
		}
		err := t.read(w.Buffer(i))
		if err == nil {
			err = w.CopyAsync(t.j.region, t.off, i, t.n)
		}
		if err != nil {
			t.j.finish(err)
			continue
		}
		pending[i] = &t
	}
}

// read preads the task's range into buf. With O_DIRECT the length is
// rounded up to the page (the file's end stops it short).
func (t *task) read(buf []byte) error {
	want := t.n
	if t.j.direct {
		want = int(gpu.RoundUp(int64(t.n), 4096))
	}
	fd := int(t.j.f.Fd())
	for got := 0; got < t.n; {
		k, err := unix.Pread(fd, buf[got:want], t.off+int64(got))
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			return fmt.Errorf("pread at %d: %w", t.off+int64(got), err)
		case k == 0:
			return fmt.Errorf("pread at %d: %w (the file shrank)", t.off+int64(got), io.ErrUnexpectedEOF)
		}
		got += k
	}
	return nil
}

func (t *task) readCuFile() error {
	for done := 0; done < t.n; {
		off := t.off + int64(done)
		k, err := t.j.cf.ReadInto(t.j.region, off, off, t.n-done)
		switch {
		case err != nil:
			return fmt.Errorf("cuFileRead at %d: %w", off, err)
		case k == 0:
			return fmt.Errorf("cuFileRead at %d: %w (the file shrank)", off, io.ErrUnexpectedEOF)
		}
		done += k
	}
	return nil
}
