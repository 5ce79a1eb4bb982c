package loader

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/gpu"
)

// job is one file's load: its tasks run on the loader's workers.
type job struct {
	rel    string // for hooks and logs
	region gpu.Region
	start  int64            // the file's bytes [start, size) are loaded
	size   int64            // (a share of a split ingest starts past 0)
	f      *os.File         // POSIX path
	direct bool             // f has O_DIRECT
	cf     gpu.CuFileHandle // cuFile path when not nil
	bg     *Background      // a background load's priority and cancellation; nil: demand
	next   int64            // offset of the next task to hand out; guarded by Loader.mu
	left   atomic.Int64     // tasks not finished
	done   chan struct{}    // closed when every task finished
	failed atomic.Bool      // a task failed: skip the rest
	errMu  sync.Mutex       // guards err
	err    error            // the first task error
	l      *Loader          // the loader running it (run sets it)
}

// gentleTasks bounds the tasks of gentle loads in flight on one loader
// (one device's link): a staging after a plain read may run
// beside a reader still copying the file to the device itself, so such
// stagings take two of the workers together, not all of them, until a
// demand joins them.
const gentleTasks = 2

// gentle reports whether j's tasks count against gentleTasks: a staging
// after a read nobody has joined.
func (j *job) gentle() bool { return j.bg != nil && j.bg.Gentle && j.low() }

// end ends task t (handed out by take).
func (t *task) end(err error) {
	if t.gentle {
		l := t.j.l
		l.mu.Lock()
		l.gentle--
		l.mu.Unlock()
		l.signal() // a worker may take the next gentle task
	}
	t.j.finish(err)
}

// finish ends one task of j; the last closes j.done.
func (j *job) finish(err error) {
	if err != nil {
		j.errMu.Lock()
		if j.err == nil {
			j.err = err
		}
		j.errMu.Unlock()
		j.failed.Store(true)
	}
	if j.left.Add(-1) == 0 {
		close(j.done)
	}
}

// low reports whether j's tasks yield to demand tasks: a background load
// nobody has joined.
func (j *job) low() bool { return j.bg != nil && j.bg.Low.Load() }

// ctx is what ends j early: the loader closing, or a background load's
// cancellation.
func (j *job) ctx(l *Loader) context.Context {
	if j.bg != nil {
		return j.bg.Ctx
	}
	return l.ctx
}

type task struct {
	j      *job
	gentle bool // counted in Loader.gentle
	off    int64
	n      int
	err    error // the first error of its pieces; owned by the worker running it
}

// Loader runs one device's loads: tasks on io.num_threads workers, each
// owning a gpu.Worker (a stream and two bounce buffers of io.bounce_size)
// made when it starts. Jobs take turns, one task each; a job at demand
// priority always goes before a background job (job.low), so a
// background load only uses workers demand leaves idle.
type Loader struct {
	// Constant once New returns.
	dev    gpu.Device
	opts   Options
	hooks  Hooks
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup // the workers
	wake   chan struct{}  // capacity 1: tasks are waiting

	// mu is a leaf lock: nothing else is taken while it is held.
	mu     sync.Mutex
	jobs   []*job // jobs with tasks not handed out yet, in turn order
	gentle int    // tasks of gentle jobs in flight
}

// New starts a loader of opts.NumThreads workers onto dev; they stop when
// ctx is done or Close is called.
func New(ctx context.Context, dev gpu.Device, opts Options, hooks Hooks) *Loader {
	l := &Loader{dev: dev, opts: opts, hooks: hooks, wake: make(chan struct{}, 1)}
	l.ctx, l.cancel = context.WithCancel(ctx)
	for range opts.NumThreads {
		l.wg.Add(1)
		go l.work()
	}
	return l
}

// Close stops the workers and waits for them. Loads still running fail
// their remaining tasks ("cache closing").
func (l *Loader) Close() {
	l.cancel()
	l.wg.Wait()
}

// run splits j into tasks, queues them and waits for all of them. When j's
// context ends first (the cache closes, a read-ahead load is cancelled),
// the tasks not handed out yet fail with its error.
func (l *Loader) run(j *job) error {
	ts := l.opts.TaskSize
	n := (j.size - j.start + ts - 1) / ts
	if n <= 0 {
		return nil
	}
	j.next = j.start
	j.done = make(chan struct{})
	j.l = l
	j.left.Store(n)
	l.mu.Lock()
	l.jobs = append(l.jobs, j)
	l.mu.Unlock()
	l.signal()
	if l.hooks.Queued != nil {
		l.hooks.Queued(j.rel, j.low())
	}
	ctx := j.ctx(l)
	select {
	case <-j.done:
	case <-ctx.Done():
		l.withdraw(j, ctx.Err())
		<-j.done
	}
	return j.err
}

// withdraw fails j's tasks not handed out yet with err.
func (l *Loader) withdraw(j *job, err error) {
	what := "cache closing"
	if j.bg != nil {
		what = "read-ahead cancelled"
	}
	l.mu.Lock()
	left := int64(0)
	if i := slices.Index(l.jobs, j); i >= 0 {
		l.jobs = slices.Delete(l.jobs, i, i+1)
		ts := l.opts.TaskSize
		left = (j.size - j.next + ts - 1) / ts
		j.next = j.size
	}
	l.mu.Unlock()
	for range left {
		j.finish(fmt.Errorf("%s: %w", what, err))
	}
}

// take hands out the next task: of the first job in turn at demand
// priority, else of the first background job (a gentle one only below
// gentleTasks in flight). That job goes to the back of the turn. nil: no
// task may start now.
func (l *Loader) take() *task {
	l.mu.Lock()
	defer l.mu.Unlock()
	i := slices.IndexFunc(l.jobs, func(j *job) bool { return !j.low() })
	if i < 0 {
		i = slices.IndexFunc(l.jobs, func(j *job) bool { return !j.gentle() || l.gentle < gentleTasks })
	}
	if i < 0 {
		return nil
	}
	j := l.jobs[i]
	t := &task{j: j, off: j.next, n: int(min(l.opts.TaskSize, j.size-j.next)), gentle: j.gentle()}
	j.next += int64(t.n)
	if t.gentle {
		l.gentle++
	}
	l.jobs = slices.Delete(l.jobs, i, i+1)
	if j.next < j.size {
		l.jobs = append(l.jobs, j)
	}
	if len(l.jobs) > 0 {
		l.signal() // another idle worker may take the next
	}
	return t
}

// Signal wakes a worker: a job's priority rose (its Background.Low was
// cleared), so a task held back may start now.
func (l *Loader) Signal() { l.signal() }

func (l *Loader) signal() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
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
		p.t.end(p.t.err)
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

func (l *Loader) work() {
	defer l.wg.Done()
	bounce := int(min(int64(l.opts.BounceSize), l.opts.TaskSize))
	wk := &worker{size: bounce}
	wk.w, wk.err = l.dev.NewWorker(bounce)
	defer func() {
		if wk.w != nil {
			wk.flush()
			wk.w.Close()
		}
	}()
	for {
		t := l.take()
		if t == nil {
			if wk.w != nil {
				wk.flush() // idle: complete copies before blocking
			}
			select {
			case <-l.wake:
				continue
			case <-l.ctx.Done():
				return
			}
		}
		switch {
		case t.j.failed.Load():
			t.end(nil)
		case t.j.bg != nil && t.j.bg.Ctx.Err() != nil:
			t.end(fmt.Errorf("read-ahead cancelled: %w", t.j.bg.Ctx.Err()))
		case t.j.cf != nil:
			t.end(t.readCuFile())
		case wk.err != nil:
			t.end(fmt.Errorf("bounce buffers: %w", wk.err))
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
			t.end(t.err)
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
			return fmt.Errorf("pread at %d: end of file: it shrank: %w", off+int64(got), ErrChanged)
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
			return fmt.Errorf("cuFileRead at %d: end of file: it shrank: %w", off, ErrChanged)
		}
		done += k
	}
	return nil
}
