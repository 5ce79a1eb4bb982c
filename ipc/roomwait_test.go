package ipc_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/gdsfs/gdsfs/internal/units"
	"github.com/gdsfs/gdsfs/ipc"
	"github.com/gdsfs/gdsfs/proto"
)

// answerWithin reads r's next answer, failing with what if none comes
// within d: a bound far past the room_wait_ms the tests ask for, which
// only a daemon that ignores it reaches.
func answerWithin(t *testing.T, r *raw, d time.Duration, what string) proto.Response {
	t.Helper()
	r.c.SetReadDeadline(time.Now().Add(d))
	line, fds, err := r.r.Next()
	proto.CloseFDs(fds)
	if err != nil {
		t.Fatalf("no answer within %s (%v): %s", d, err, what)
	}
	resp, err := proto.DecodeResponse(line)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// TestRoomWaitEndsTheWaitForCapacity: with the capacity held by another
// uid's lease and ipc.acquire_timeout ten minutes, an acquire (and an
// acquire_many) naming room_wait_ms 20 is answered ENOSPC naming that
// bound, not after ipc.acquire_timeout.
func TestRoomWaitEndsTheWaitForCapacity(t *testing.T) {
	needRoot(t)
	f := start(t, ipc.SharingShared, setup{capacity: 4 << 20, chunk: 4 << 20, opts: func(o *ipc.Options) { o.AcquireTimeout = 10 * time.Minute }})
	f.write(t, "a", pattern(3<<20, 1))
	f.write(t, "b", pattern(3<<20, 2))
	if _, err := f.cache.Stage(context.Background(), "a"); err != nil {
		t.Fatal(err)
	}
	h := dialAs(t, f.srv.Path(), nobody, nobody)
	if resp, _ := h.do(acquireReq("a")); !resp.OK {
		t.Fatal(resp.Error)
	}
	r := dial(t, f.srv.Path())
	r.c.Write(line(proto.Request{Op: proto.OpAcquire, Path: "b", RoomWaitMS: 20}))
	resp := answerWithin(t, r, time.Minute, "room_wait_ms ignored")
	if resp.Errno != "ENOSPC" || !strings.Contains(resp.Error, "room_wait_ms 20") {
		t.Fatalf("acquire with the capacity held: %+v, want ENOSPC naming room_wait_ms", resp)
	}
	r.c.Write(line(proto.Request{Op: proto.OpAcquireMany, Paths: []string{"b"}, RoomWaitMS: 20}))
	resp = answerWithin(t, r, time.Minute, "room_wait_ms ignored by acquire_many")
	if !resp.OK || len(resp.Files) != 1 || resp.Files[0].Errno != "ENOSPC" || !strings.Contains(resp.Files[0].Error, "room_wait_ms 20") {
		t.Fatalf("acquire_many with the capacity held: %+v, want its item ENOSPC naming room_wait_ms", resp)
	}
	h.c.Close() // room again: the same request is served
	f.waitClosed(t, 1)
	r.c.Write(line(proto.Request{Op: proto.OpAcquire, Path: "b", RoomWaitMS: 20}))
	if resp := answerWithin(t, r, time.Minute, "acquire with room"); !resp.OK {
		t.Fatalf("acquire once the holder closed: %+v", resp)
	}
}

// TestRoomWaitEndsTheWaitForHeldRoom: over ipc.max_held_per_uid, an
// acquire naming room_wait_ms waits that long for the uid's connections
// to close, not ipc.acquire_timeout, and answers EDQUOT naming it.
func TestRoomWaitEndsTheWaitForHeldRoom(t *testing.T) {
	needRoot(t)
	f := start(t, ipc.SharingShared, setup{opts: func(o *ipc.Options) {
		o.MaxHeldPerUID = units.Share{Bytes: 100 << 10}
		o.AcquireTimeout = 10 * time.Minute
	}})
	f.write(t, "a", pattern(60<<10, 1))
	f.write(t, "b", pattern(60<<10, 2))
	h := dialAs(t, f.srv.Path(), nobody, nobody)
	if resp, _ := h.do(acquireReq("a")); !resp.OK {
		t.Fatalf("first acquire: %+v", resp)
	}
	r := dialAs(t, f.srv.Path(), nobody, nobody)
	r.c.Write(line(proto.Request{Op: proto.OpAcquire, Path: "b", RoomWaitMS: 20}))
	resp := answerWithin(t, r, time.Minute, "room_wait_ms ignored")
	if resp.Errno != "EDQUOT" || !strings.Contains(resp.Error, "room_wait_ms 20") {
		t.Fatalf("acquire past the uid's limit: %+v, want EDQUOT naming room_wait_ms", resp)
	}
}
