package staging

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/gdsfs/gdsfs/gpu"
	"github.com/gdsfs/gdsfs/internal/fifo"
)

// Waiting for room. When the capacity (or the descriptor budget) is held
// by leases and loads, an acquire waits for room, first come first served,
// bounded by its context and by its Request.RoomWait: ENOSPC only once
// either ran out (or at once for a prefetch, which never waits), EFBIG at
// once for a file that could never fit. RoomWait bounds the wait for room
// only, counted from when the request got in line: a load it joins or
// starts is bounded by the context alone. While anyone waits, nobody else takes room: a
// stream of small files cannot starve a large one. Requests that need no
// room (a resident file, a load in flight) are served at once.

// waiter is one request waiting for room.
type waiter struct {
	wake  chan struct{} // capacity 1: room may have appeared
	since time.Time     // when the request got in line (RoomWait counts from it); guarded by Cache.mu
}

// waiters is the line of requests waiting for room (internal/fifo).
type waiters = fifo.Queue[*waiter]

// errWaitRoom is what a reservation answers when its request must wait.
var errWaitRoom = errors.New("waiting for room")

// mayReserveLocked says whether the request waiting as w (nil: not
// waiting) may try to reserve now: nobody waits, or w is first, and the
// cache is not being handed over (handover.go). Cache.mu must be held.
func (c *Cache) mayReserveLocked(w *waiter) bool {
	return !c.handedOff && c.waiters.MayGo(w)
}

// admitLocked reserves need bytes on s and fds descriptors, evicting
// unleased resident entries as needed, for the request in line as w (nil:
// not in line) if it may go now (mayReserveLocked). It returns the
// evicted regions for the caller to free after unlocking (unlockFree) and
// whether the room is reserved. Loads (startLocked) and private copies
// (copyPrivate) take room through it. Cache.mu must be held.
func (c *Cache) admitLocked(w *waiter, s *slot, need int64, fds int) ([]gpu.Region, bool) {
	if !c.mayReserveLocked(w) {
		return nil, false
	}
	victims, ok := c.reserveLocked(s, need, fds)
	return c.detachVictimsLocked(victims), ok
}

// queueLocked puts the request holding *w at the back of the line unless
// it is in line: again after it left it (its load started, then failed or
// was dropped), its wait counted anew. Cache.mu must be held.
func (c *Cache) queueLocked(w **waiter) {
	if *w == nil {
		*w = &waiter{wake: make(chan struct{}, 1)}
		c.stats.roomWaits.Add(1)
	}
	if c.waiters.Join(*w) {
		(*w).since = time.Now()
	}
}

// leaveLocked takes w out of line (nil: nothing) and wakes the next, who
// may fit now. Cache.mu must be held.
func (c *Cache) leaveLocked(w *waiter) {
	if w != nil && c.waiters.Leave(w) {
		c.wakeLocked()
	}
}

// wakeLocked tells the first waiter that room may have appeared: bytes or
// descriptors were given back, or an entry became evictable. Cache.mu
// must be held.
func (c *Cache) wakeLocked() {
	if w, ok := c.waiters.Front(); ok {
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
}

// awaitRoom sleeps until w is woken, ctx is done, bound (0: none) has
// passed since w got in line, or the cache closes. It takes w out of line
// when it gives up: past ctx's deadline or bound the answer is ENOSPC
// (need bytes never found room), a cancelled ctx its error.
func (c *Cache) awaitRoom(ctx context.Context, w *waiter, rel string, need int64, bound time.Duration) error {
	if c.hooks.waiting != nil {
		c.hooks.waiting(rel)
	}
	var over <-chan time.Time
	if bound > 0 {
		t := time.NewTimer(time.Until(w.since.Add(bound)))
		defer t.Stop()
		over = t.C
	}
	select {
	case <-w.wake:
		return nil
	case <-ctx.Done():
	case <-c.ctx.Done():
	case <-over:
	}
	c.lock()
	c.leaveLocked(w)
	c.unlock()
	switch {
	case c.ctx.Err() != nil:
		return fmt.Errorf("stage %s: cache closed", rel)
	case ctx.Err() == nil: // bound passed
		c.stats.noSpace.Add(1)
		return errRoomWaitOver(rel, need, bound)
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		c.stats.noSpace.Add(1)
		return fmt.Errorf("%s: no room for %d bytes before the deadline: the rest of the cache is leased or loading: %w",
			rel, need, syscall.ENOSPC)
	}
	return fmt.Errorf("stage %s: %w", rel, ctx.Err())
}
