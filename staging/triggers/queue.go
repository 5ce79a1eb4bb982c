package triggers

import (
	"context"
	"strings"
	"sync"

	"go.uber.org/zap"
)

// Queue is the bounded, de-duplicated prefetch queue and its workers.
type Queue struct {
	// Constant once NewQueue returns.
	ch      chan request
	workers int
	log     *zap.Logger

	wg sync.WaitGroup // the workers

	// Mutable, guarded by mu.
	mu   sync.Mutex
	keys map[string]bool // queued or being staged: a duplicate is not queued again
}

// request is one queued staging: a path, the devices to stage it on
// (names; none: wherever staging puts it), and whether it is a staging
// after a read (whose load yields to a new reader).
type request struct {
	rel       string
	on        []string
	afterRead bool
}

// key identifies the request for duplicates: the path, the devices, and
// whether it is a staging after a read (a prefetch is never merged into
// one, as that one yields to a reader).
func (r request) key() string {
	var b strings.Builder
	b.WriteString(r.rel)
	for _, d := range r.on {
		b.WriteByte(0)
		b.WriteString(d)
	}
	if r.afterRead {
		b.WriteString("\x00after read")
	}
	return b.String()
}

// NewQueue makes a queue of size requests that workers stage, once Run
// starts them.
func NewQueue(size, workers int, log *zap.Logger) *Queue {
	if log == nil {
		log = zap.NewNop()
	}
	return &Queue{ch: make(chan request, size), workers: workers, log: log, keys: map[string]bool{}}
}

// Offer queues a request unless the same one is queued (ok and not
// added). ok false: the queue is full and the request was dropped. It
// never blocks and never calls the cache.
func (q *Queue) Offer(rel string, on []string, afterRead bool) (ok, added bool) {
	r := request{rel: rel, on: on, afterRead: afterRead}
	k := r.key()
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.keys[k] {
		return true, false
	}
	select {
	case q.ch <- r:
		q.keys[k] = true
		return true, true
	default:
		return false, false
	}
}

// Len is the number of requests queued or being staged.
func (q *Queue) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.keys)
}

// Run starts the workers until ctx is done. Each stages a request with
// stage, then hands its end to done with forget, which done calls where
// the request must stop counting as queued (the cache: under its lock).
func (q *Queue) Run(ctx context.Context,
	stage func(ctx context.Context, rel string, on []string, afterRead bool) error,
	done func(rel string, on []string, afterRead bool, err error, forget func())) {
	for range q.workers {
		q.wg.Add(1)
		go q.work(ctx, stage, done)
	}
}

// Wait returns once the workers Run started have stopped.
func (q *Queue) Wait() { q.wg.Wait() }

func (q *Queue) work(ctx context.Context,
	stage func(ctx context.Context, rel string, on []string, afterRead bool) error,
	done func(rel string, on []string, afterRead bool, err error, forget func())) {
	defer q.wg.Done()
	for {
		select {
		case <-ctx.Done():
			return
		case r := <-q.ch:
			// r stays queued until staged, so a queued file never reads
			// as absent and is not queued twice meanwhile.
			err := stage(ctx, r.rel, r.on, r.afterRead)
			if err != nil {
				q.log.Debug("prefetch", zap.String("path", r.rel), zap.Error(err))
			}
			done(r.rel, r.on, r.afterRead, err, func() { q.forget(r) })
		}
	}
}

// forget ends r: it no longer counts as queued.
func (q *Queue) forget(r request) {
	q.mu.Lock()
	delete(q.keys, r.key())
	q.mu.Unlock()
}
