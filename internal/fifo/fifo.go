// Package fifo is a first-come-first-served line of requests waiting for
// room: the cache's waiters for device capacity (staging) and each uid's
// waiters under ipc.max_held_per_uid (ipc). While anyone waits, only the
// first may take room, so a stream of small requests cannot starve a
// large one.
//
// A Queue has no lock of its own: its owner guards every call with the
// lock that guards the room. It never blocks and never wakes anyone: the
// owner wakes the first (Front) when room may have appeared.
package fifo

import "slices"

// Queue is a line of distinct requests, first come first served. The zero
// value is an empty line.
type Queue[T comparable] struct {
	line []T // INVARIANT: no request twice
}

// Join puts r at the back of the line unless it is in line, and reports
// whether it joined now.
func (q *Queue[T]) Join(r T) bool {
	if q.Has(r) {
		return false
	}
	q.line = append(q.line, r)
	return true
}

// Leave takes r out of the line and reports whether it was in line.
func (q *Queue[T]) Leave(r T) bool {
	i := slices.Index(q.line, r)
	if i < 0 {
		return false
	}
	q.line = slices.Delete(q.line, i, i+1)
	return true
}

// Has says whether r is in line.
func (q *Queue[T]) Has(r T) bool { return slices.Contains(q.line, r) }

// MayGo says whether r may take room now: nobody waits, or r is first.
func (q *Queue[T]) MayGo(r T) bool { return len(q.line) == 0 || q.line[0] == r }

// Front is the first request in line; ok is false when nobody waits.
func (q *Queue[T]) Front() (r T, ok bool) {
	if len(q.line) == 0 {
		return r, false
	}
	return q.line[0], true
}

// Len is how many requests wait.
func (q *Queue[T]) Len() int { return len(q.line) }
