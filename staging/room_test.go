package staging

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gdsfs/gdsfs/internal/units"
)

// roomCache has room for two 16 KiB files, a and b leased, and files c, d
// (16 KiB) and big (32 KiB) waiting to be asked for.
func roomCache(t *testing.T) (c *Cache, la, lb *Lease, waiting chan string) {
	src := t.TempDir()
	for name, n := range map[string]int{"a": 16 << 10, "b": 16 << 10, "c": 16 << 10, "d": 16 << 10, "big": 32 << 10} {
		writeFile(t, src, name, randomBytes(n, uint64(n+len(name))))
	}
	opts, io := testOptions()
	opts.Capacity = units.Share{Bytes: 32 << 10}
	c = newCache(t, src, opts, io)
	waiting = make(chan string, 16)
	c.hooks.waiting = func(rel string) { waiting <- rel }
	var err error
	if la, err = c.Acquire(context.Background(), Request{Rel: "a"}); err != nil {
		t.Fatal(err)
	}
	if lb, err = c.Acquire(context.Background(), Request{Rel: "b"}); err != nil {
		t.Fatal(err)
	}
	return c, la, lb, waiting
}

type acquired struct {
	l   *Lease
	err error
}

func acquireAsync(c *Cache, ctx context.Context, rel string) chan acquired {
	ch := make(chan acquired, 1)
	go func() {
		l, err := c.Acquire(ctx, Request{Rel: rel})
		ch <- acquired{l, err}
	}()
	return ch
}

// expectWaiting waits until the request for rel (whose answer comes on
// res) goes to wait for room, failing if it is answered instead.
func expectWaiting(t *testing.T, waiting chan string, rel string, res chan acquired) {
	t.Helper()
	select {
	case got := <-waiting:
		if got != rel {
			t.Fatalf("%s went to wait for room, want %s", got, rel)
		}
	case r := <-res:
		t.Fatalf("%s did not wait for room: %v", rel, r.err)
	}
}

// TestWaitForRoomInOrder: with the capacity held by leases, an
// acquire waits for room instead of failing, and waiters are served first
// come first served: a small file asked for after a large one does not
// take the room the large one waits for.
func TestWaitForRoomInOrder(t *testing.T) {
	c, la, lb, waiting := roomCache(t)
	ctx := context.Background()
	big := acquireAsync(c, ctx, "big")
	expectWaiting(t, waiting, "big", big)
	small := acquireAsync(c, ctx, "c")
	expectWaiting(t, waiting, "c", small)

	la.Release() // room for c, not for big: c must still wait behind big
	expectWaiting(t, waiting, "big", big)
	select {
	case r := <-small:
		t.Fatalf("c jumped the line: %v", r.err)
	default:
	}
	if s := c.Stats(); s.RoomWaiting != 2 || s.UsedBytes != 32<<10 {
		t.Fatalf("waiting %d, used %d", s.RoomWaiting, s.UsedBytes)
	}

	lb.Release() // room for big
	r := <-big
	if r.err != nil {
		t.Fatalf("big: %v", r.err)
	}
	expectWaiting(t, waiting, "c", small) // big holds all of it now
	r.l.Release()
	if r := <-small; r.err != nil {
		t.Fatalf("c: %v", r.err)
	} else {
		r.l.Release()
	}
	if s := c.Stats(); s.RoomWaiting != 0 || s.RoomWaits != 2 || s.NoSpace != 0 || s.LeasesActive != 0 {
		t.Fatalf("stats %+v", s)
	}
}

// TestWaitForRoomTimesOut: a waiter whose deadline passes gets ENOSPC
// and leaves the line; one whose context is cancelled gets its error; a
// prefetch never waits and never takes room from a waiter.
func TestWaitForRoomTimesOut(t *testing.T) {
	c, la, lb, waiting := roomCache(t)
	defer la.Release()
	defer lb.Release()
	short, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := c.Acquire(short, Request{Rel: "c"}); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("acquire with no room before the deadline: %v, want ENOSPC", err)
	}
	select { // the hook ran before Acquire answered
	case got := <-waiting:
		if got != "c" {
			t.Fatalf("%s waited", got)
		}
	default:
		t.Fatal("the acquire did not wait for room before answering ENOSPC")
	}

	ctx, stop := context.WithCancel(context.Background())
	r := acquireAsync(c, ctx, "big")
	expectWaiting(t, waiting, "big", r)
	done := make(chan string, 1)
	c.hooks.prefetchDone = func(rel string) { done <- rel }
	la.Release() // room for d, not for big: big waits on, d may not pass it
	expectWaiting(t, waiting, "big", r)
	c.Prefetch("d")
	<-done
	if state, _ := c.Attr("d"); state != StateAbsent {
		t.Fatalf("a prefetch took room from a waiting acquire: d is %s", state)
	}
	stop()
	if got := <-r; !errors.Is(got.err, context.Canceled) {
		t.Fatalf("cancelled waiter: %v", got.err)
	}
	if s := c.Stats(); s.RoomWaiting != 0 || s.NoSpace != 2 {
		t.Fatalf("waiting %d, no_space %d: want 0 and 2 (the timeout, the prefetch)", s.RoomWaiting, s.NoSpace)
	}
}

// TestRoomWaitBoundsOnlyTheWaitForRoom: Request.RoomWait ends a wait for
// room with ENOSPC (ErrRoomWait) while the context has no deadline, and
// does not cut short a load that needed no wait: f, loading (its copy
// held back), is still being waited for after g's RoomWait, which began
// after f's request, has run out.
func TestRoomWaitBoundsOnlyTheWaitForRoom(t *testing.T) {
	src := t.TempDir()
	writeFile(t, src, "f", randomBytes(700<<10, 1))
	writeFile(t, src, "g", randomBytes(700<<10, 2))
	d := newFake(1 << 20)
	started, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	d.copyHook = func() error {
		once.Do(func() { close(started) })
		<-release
		return nil
	}
	var opened sync.Once
	open := func() { opened.Do(func() { close(release) }) }
	defer open()
	opts, io := testOptions()
	opts.RacyWindow = 0
	opts.Capacity = units.Share{Bytes: 1 << 20} // room for one of them
	c := newCache(t, src, opts, io, d)

	const bound = 5 * time.Millisecond
	f := make(chan acquired, 1)
	go func() {
		l, err := c.Acquire(context.Background(), Request{Rel: "f", RoomWait: bound})
		f <- acquired{l, err}
	}()
	<-started // f loads: the capacity is taken
	g := make(chan acquired, 1)
	go func() {
		l, err := c.Acquire(context.Background(), Request{Rel: "g", RoomWait: bound})
		g <- acquired{l, err}
	}()
	select {
	case r := <-g:
		if !errors.Is(r.err, syscall.ENOSPC) || !errors.Is(r.err, ErrRoomWait) {
			t.Fatalf("g with no room: %v, want ENOSPC wrapping ErrRoomWait", r.err)
		}
	case <-time.After(time.Minute):
		t.Fatal("g waited a minute for room: RoomWait ignored")
	}
	select {
	case r := <-f:
		t.Fatalf("f's load was cut short by RoomWait: %v", r.err)
	default:
	}
	open()
	r := <-f
	if r.err != nil {
		t.Fatalf("f: %v", r.err)
	}
	r.l.Release()
	if s := c.Stats(); s.RoomWaiting != 0 || s.NoSpace != 1 {
		t.Fatalf("waiting %d, no_space %d: want 0 and 1", s.RoomWaiting, s.NoSpace)
	}
}

// TestRoomWaitBoundsAPrivateCopy: a private lease of a resident file
// whose copy finds no room fails with ENOSPC (ErrRoomWait) once RoomWait
// has passed, while its context has no deadline.
func TestRoomWaitBoundsAPrivateCopy(t *testing.T) {
	c, la, lb, waiting := roomCache(t)
	defer la.Release()
	defer lb.Release()
	res := make(chan acquired, 1)
	go func() {
		l, err := c.Acquire(context.Background(), Request{Rel: "a", Private: true, RoomWait: 5 * time.Millisecond})
		res <- acquired{l, err}
	}()
	expectWaiting(t, waiting, "a (private copy)", res)
	select {
	case r := <-res:
		if !errors.Is(r.err, syscall.ENOSPC) || !errors.Is(r.err, ErrRoomWait) {
			t.Fatalf("private copy with no room: %v, want ENOSPC wrapping ErrRoomWait", r.err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the private copy waited a minute for room: RoomWait ignored")
	}
	if s := c.Stats(); s.RoomWaiting != 0 || s.LeasesActive != 2 {
		t.Fatalf("waiting %d, leases %d: want 0 and 2 (a and b)", s.RoomWaiting, s.LeasesActive)
	}
}

// TestRetryWaitsInLine: a request that waited for room, loaded, saw its
// file change under the load and finds no room for the next one waits in
// line again, and is woken when room comes back.
func TestRetryWaitsInLine(t *testing.T) {
	src := t.TempDir()
	for i, n := range []string{"f", "g", "h"} {
		writeFile(t, src, n, randomBytes(700<<10, uint64(i+1)))
	}
	fresh := randomBytes(700<<10, 4)
	d := newFake(1 << 20)
	opts, io := testOptions()
	opts.RacyWindow = 0
	opts.Capacity = units.Share{Bytes: 1 << 20} // room for one of them
	c := newCache(t, src, opts, io, d)
	waiting := make(chan string, 16)
	c.hooks.waiting = func(rel string) { waiting <- rel }
	lh, err := c.Acquire(context.Background(), Request{Rel: "h"})
	if err != nil {
		t.Fatal(err)
	}
	started, proceed := make(chan struct{}), make(chan struct{})
	var once sync.Once
	d.copyHook = func() error {
		once.Do(func() { // f's first load: g gets in line, then f changes
			close(started)
			<-proceed
			os.WriteFile(filepath.Join(src, "f"), fresh, 0o644)
		})
		return nil
	}

	f := acquireAsync(c, context.Background(), "f")
	expectWaiting(t, waiting, "f", f)
	lh.Release() // f loads
	<-started
	g := acquireAsync(c, context.Background(), "g")
	expectWaiting(t, waiting, "g", g)
	close(proceed) // f's load fails; g takes the room; f must wait in line
	rg := <-g
	if rg.err != nil {
		t.Fatalf("g: %v", rg.err)
	}
	rg.l.Release()
	select {
	case r := <-f:
		if r.err != nil {
			t.Fatalf("f: %v", r.err)
		}
		r.l.Release()
	case <-time.After(time.Minute):
		t.Fatal("f was not woken when g's room came back: its retry waited out of line")
	}
	checkStaged(t, c, "f", fresh)
}
