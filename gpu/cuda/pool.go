package cuda

import (
	"errors"
	"sync"
)

// chunkPool keeps physical allocations (cuMemCreate handles) of the
// device's chunk size made ahead of need, so that staging a new file maps
// chunks that exist instead of waiting for cuMemCreate: device memory is
// ready before the load needs it. A chunk taken is replaced in the
// background. A freed region's chunks go back to the pool when they were
// never exported (a consumer that imported one could still map it, and
// must never see another file's bytes); the rest are released.
//
// The pool holds at most target chunks: device memory beyond the cache's
// capacity, so target is capped at 1/32 of the device's memory.
type chunkPool struct {
	ctx    *cuContext
	size   int64 // bytes per chunk: the device's chunk size
	target int

	mu     sync.Mutex
	ready  []uint64 // guarded by mu
	closed bool     // guarded by mu
	hits   uint64   // guarded by mu: chunks handed out ready

	kick chan struct{} // capacity 1: below target
	done chan struct{} // closed when refill returned
}

// newChunkPool makes target chunks now (as many as fit) and keeps that
// many ready from then on.
func newChunkPool(ctx *cuContext, size int64, target int) *chunkPool {
	p := &chunkPool{ctx: ctx, size: size, target: target, kick: make(chan struct{}, 1), done: make(chan struct{})}
	p.fill()
	go p.refill()
	return p
}

// take returns a ready chunk of p.size bytes, if there is one.
func (p *chunkPool) take() (uint64, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.ready) == 0 {
		p.poke()
		return 0, false
	}
	h := p.ready[len(p.ready)-1]
	p.ready = p.ready[:len(p.ready)-1]
	p.hits++
	p.poke()
	return h, true
}

// put keeps h (a chunk of p.size bytes, never exported) for the next
// region; false when the pool is full or closed: the caller releases it.
func (p *chunkPool) put(h uint64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || len(p.ready) >= p.target {
		return false
	}
	p.ready = append(p.ready, h)
	return true
}

// poke wakes refill. p.mu must be held.
func (p *chunkPool) poke() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// fill makes chunks until target are ready or the device refuses.
func (p *chunkPool) fill() {
	for {
		p.mu.Lock()
		short := !p.closed && len(p.ready) < p.target
		p.mu.Unlock()
		if !short {
			return
		}
		h, err := p.ctx.memCreate(p.size)
		if err != nil {
			return // out of memory for now: the next take tries again
		}
		if !p.put(h) {
			p.ctx.memRelease(h)
			return
		}
	}
}

func (p *chunkPool) refill() {
	defer close(p.done)
	for range p.kick {
		p.mu.Lock()
		closed := p.closed
		p.mu.Unlock()
		if closed {
			return
		}
		p.fill()
	}
}

// stats reports the chunks ready and those handed out ready so far.
func (p *chunkPool) stats() (ready int, hits uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.ready), p.hits
}

// close stops refilling and releases the ready chunks.
func (p *chunkPool) close() error {
	p.mu.Lock()
	p.closed = true
	ready := p.ready
	p.ready = nil
	p.poke()
	p.mu.Unlock()
	<-p.done
	var errs []error
	for _, h := range ready {
		errs = append(errs, p.ctx.memRelease(h))
	}
	return errors.Join(errs...)
}
