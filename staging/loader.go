package staging

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/gpu"
	"github.com/gdsfs/gdsfs/internal/units"
)

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
	err error // the first error of its pieces; owned by the worker running it
}

// loader runs tasks on io.num_threads workers, each owning a gpu.Worker
// (a stream and two bounce buffers of io.bounce_size) made when it starts.
type loader struct {
	c     *Cache
	slot  *slot
	tasks chan *task // unbuffered: a sent task is always finished by a worker
}

func newLoader(c *Cache, s *slot) *loader {
	l := &loader{c: c, slot: s, tasks: make(chan *task)}
	for range int(c.io.NumThreads) {
		c.wg.Add(1)
		go l.work()
	}
	return l
}

// run splits j into tasks and waits for all of them.
func (l *loader) run(j *job) error {
	ts := int64(l.c.io.TaskSize)
	for off := int64(0); off < j.size; off += ts {
		j.wg.Add(1)
		select {
		case l.tasks <- &task{j: j, off: off, n: int(min(ts, j.size-off))}:
		case <-l.c.ctx.Done():
			j.finish(fmt.Errorf("cache closing: %w", l.c.ctx.Err()))
			off = j.size
		}
	}
	j.wg.Wait()
	return j.err
}

// piece is one bounce buffer's worth of a task, in flight to the device.
type piece struct {
	t    *task
	last bool // the task's last piece: its completion finishes the task
}

// worker is one loader goroutine's state: a task is read in pieces of
// io.bounce_size, alternating the two buffers so that one is filled while
// the other's copy to the device is in flight. The stream runs copies in
// order, so a task is done when its last piece is.
type worker struct {
	w        gpu.Worker
	err      error // why w could not be made
	inflight [2]*piece
	next     int
	size     int // bounce buffer size
}

// complete waits for buffer i's copy and accounts for it.
func (wk *worker) complete(i int) {
	p := wk.inflight[i]
	if p == nil {
		return
	}
	wk.inflight[i] = nil
	if err := wk.w.Wait(i); err != nil && p.t.err == nil {
		p.t.err = err
	}
	if p.last {
		p.t.j.finish(p.t.err)
	}
}

// flush completes both buffers, oldest first: the buffer to be filled
// next holds the older copy. A task's last piece must be accounted after
// its earlier ones, or an earlier piece's error would come too late.
func (wk *worker) flush() {
	for i := range wk.inflight {
		wk.complete(wk.next ^ i)
	}
}

func (l *loader) work() {
	defer l.c.wg.Done()
	bounce := int(min(units.Size(l.c.io.BounceSize), l.c.io.TaskSize))
	wk := &worker{size: bounce}
	wk.w, wk.err = l.slot.dev.NewWorker(bounce)
	defer func() {
		if wk.w != nil {
			wk.flush()
			wk.w.Close()
		}
	}()
	for {
		var t *task
		select {
		case t = <-l.tasks:
		default:
			if wk.w != nil {
				wk.flush() // idle: complete copies before blocking
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
		case t.j.cf != nil:
			t.j.finish(t.readCuFile())
		case wk.err != nil:
			t.j.finish(fmt.Errorf("bounce buffers: %w", wk.err))
		default:
			wk.copyTask(t)
		}
	}
}

// copyTask reads t piece by piece and starts each piece's copy.
func (wk *worker) copyTask(t *task) {
	for off := 0; off < t.n; off += wk.size {
		i := wk.next
		wk.next ^= 1
		wk.complete(i)
		n := min(wk.size, t.n-off)
		err := t.read(wk.w.Buffer(i), t.off+int64(off), n)
		if err == nil {
			err = wk.w.CopyAsync(t.j.region, t.off+int64(off), i, n)
		}
		if err != nil {
			wk.flush() // the task's earlier pieces, none of them last
			if t.err == nil {
				t.err = err
			}
			t.j.finish(t.err)
			return
		}
		wk.inflight[i] = &piece{t: t, last: off+n >= t.n}
	}
}

// read preads n bytes at off into buf. With O_DIRECT the length is
// rounded up to the page (the file's end stops it short).
func (t *task) read(buf []byte, off int64, n int) error {
	want := n
	if t.j.direct {
		want = int(gpu.RoundUp(int64(n), 4096))
	}
	fd := int(t.j.f.Fd())
	for got := 0; got < n; {
		k, err := unix.Pread(fd, buf[got:want], off+int64(got))
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			return fmt.Errorf("pread at %d: %w", off+int64(got), err)
		case k == 0:
			return fmt.Errorf("pread at %d: end of file: it shrank: %w", off+int64(got), errFileChanged)
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
			return fmt.Errorf("cuFileRead at %d: end of file: it shrank: %w", off, errFileChanged)
		}
		done += k
	}
	return nil
}
