package ipc_test

import (
	"testing"

	"github.com/gdsfs/gdsfs/ipc"
	"github.com/gdsfs/gdsfs/proto"
)

// TestDropEndsTheHoldOfOneFile: on a connection holding two files, a
// drop of one stops holding it (counted no more; a repeat acquire naming
// its generation gets a full grant) once its lease is released too,
// whichever comes first; the other stays held; a generation the
// connection does not hold is refused (EINVAL); with the last file
// dropped the connection holds nothing.
func TestDropEndsTheHoldOfOneFile(t *testing.T) {
	f := newFixture(t, ipc.SharingShared)
	f.write(t, "a", pattern(256<<10, 1))
	f.write(t, "b", pattern(128<<10, 2))
	r := dial(t, f.srv.Path())
	a, fa := r.do(proto.Request{Op: proto.OpAcquire, Path: "a"})
	b, _ := r.do(proto.Request{Op: proto.OpAcquire, Path: "b"})
	if !a.OK || !b.OK || len(fa) == 0 {
		t.Fatalf("acquire: %+v %+v", a, b)
	}
	if st := f.srv.Stats(); st.HeldFiles != 2 || st.HoldingConnections != 1 {
		t.Fatalf("before drop: %d files held on %d connections; want 2 on 1", st.HeldFiles, st.HoldingConnections)
	}

	// dropped while leased: held until the lease is released
	if resp, _ := r.do(proto.Request{Op: proto.OpDrop, Generation: a.Generation, Device: a.Device}); !resp.OK {
		t.Fatalf("drop of a leased file: %+v", resp)
	}
	if st := f.srv.Stats(); st.HeldFiles != 2 {
		t.Fatalf("a dropped while leased: %d files held, want 2", st.HeldFiles)
	}
	heldB := f.srv.Stats().HeldBytes
	if resp, _ := r.do(proto.Request{Op: proto.OpRelease, Lease: a.Lease, Epoch: a.Epoch}); !resp.OK {
		t.Fatalf("release: %+v", resp)
	}
	st := f.srv.Stats()
	if st.HeldFiles != 1 || st.HoldingConnections != 1 || st.HeldBytes >= heldB {
		t.Fatalf("a released after its drop: %d files, %d bytes held on %d connections; want 1 file, fewer than %d bytes, 1 connection",
			st.HeldFiles, st.HeldBytes, st.HoldingConnections, heldB)
	}
	if resp, _ := r.do(proto.Request{Op: proto.OpDrop, Generation: a.Generation, Device: a.Device}); resp.OK || resp.Errno != "EINVAL" {
		t.Fatalf("second drop: %+v, want EINVAL", resp)
	}
	again, fds := r.do(proto.Request{Op: proto.OpAcquire, Path: "a", Generation: a.Generation})
	if !again.OK || again.Reuse || len(fds) == 0 {
		t.Fatalf("repeat acquire after drop: %+v with %d descriptors; want a full grant", again, len(fds))
	}

	// released, then dropped: let go at the drop
	for _, g := range []proto.Response{again, b} {
		r.do(proto.Request{Op: proto.OpRelease, Lease: g.Lease, Epoch: g.Epoch})
		if resp, _ := r.do(proto.Request{Op: proto.OpDrop, Generation: g.Generation, Device: g.Device}); !resp.OK {
			t.Fatalf("drop: %+v", resp)
		}
	}
	if st := f.srv.Stats(); st.HeldFiles != 0 || st.HeldBytes != 0 || st.HoldingConnections != 0 {
		t.Fatalf("all dropped: %d files, %d bytes held on %d connections; want none", st.HeldFiles, st.HeldBytes, st.HoldingConnections)
	}
}

// TestDropCountsGrants: a file granted twice in full on one connection
// (two mappings of the peer) is held until both are dropped.
func TestDropCountsGrants(t *testing.T) {
	f := newFixture(t, ipc.SharingShared)
	f.write(t, "a", pattern(64<<10, 1))
	r := dial(t, f.srv.Path())
	var gs []proto.Response
	for range 2 {
		g, fds := r.do(proto.Request{Op: proto.OpAcquire, Path: "a"})
		if !g.OK || g.Reuse || len(fds) == 0 {
			t.Fatalf("acquire: %+v with %d descriptors, want a full grant", g, len(fds))
		}
		r.do(proto.Request{Op: proto.OpRelease, Lease: g.Lease, Epoch: g.Epoch})
		gs = append(gs, g)
	}
	r.do(proto.Request{Op: proto.OpDrop, Generation: gs[0].Generation, Device: gs[0].Device})
	if st := f.srv.Stats(); st.HeldFiles != 1 {
		t.Fatalf("one of two grants dropped: %d files held, want 1", st.HeldFiles)
	}
	if g, _ := r.do(proto.Request{Op: proto.OpAcquire, Path: "a", Generation: gs[0].Generation}); !g.OK || !g.Reuse {
		t.Fatalf("repeat acquire with one grant still mapped: %+v, want reuse", g)
	} else {
		r.do(proto.Request{Op: proto.OpRelease, Lease: g.Lease, Epoch: g.Epoch})
	}
	r.do(proto.Request{Op: proto.OpDrop, Generation: gs[1].Generation, Device: gs[1].Device})
	if st := f.srv.Stats(); st.HeldFiles != 0 {
		t.Fatalf("both grants dropped: %d files held, want 0", st.HeldFiles)
	}
}

// TestDroppedFileMakesRoom: a dropped file is no longer pinned, so a
// file that needs its room is staged, where before it would wait for the
// connection to close.
func TestDroppedFileMakesRoom(t *testing.T) {
	f := start(t, ipc.SharingShared, setup{capacity: 8 << 20, chunk: 4 << 20})
	for _, p := range []string{"a", "b", "c"} {
		f.write(t, p, pattern(4<<20, len(p)))
	}
	holder := dial(t, f.srv.Path())
	a, _ := holder.do(proto.Request{Op: proto.OpAcquire, Path: "a"})
	b, _ := holder.do(proto.Request{Op: proto.OpAcquire, Path: "b"})
	if !a.OK || !b.OK {
		t.Fatalf("acquire: %+v %+v", a, b)
	}
	holder.do(proto.Request{Op: proto.OpRelease, Lease: a.Lease, Epoch: a.Epoch})
	if resp, _ := holder.do(proto.Request{Op: proto.OpDrop, Generation: a.Generation, Device: a.Device}); !resp.OK {
		t.Fatalf("drop: %+v", resp)
	}
	// the bound is only reached if a is still pinned
	c, _ := dial(t, f.srv.Path()).do(proto.Request{Op: proto.OpAcquire, Path: "c", RoomWaitMS: 30000})
	if !c.OK {
		t.Fatalf("acquire of c with a dropped: %+v", c)
	}
}

// TestDropNeedsGenerationAndDevice: drop names what it stops holding.
func TestDropNeedsGenerationAndDevice(t *testing.T) {
	f := newFixture(t, ipc.SharingShared)
	r := dial(t, f.srv.Path())
	for _, line := range []string{`{"op":"drop","generation":3}`, `{"op":"drop","device":"host"}`, `{"op":"drop","generation":3,"device":"host","path":"a"}`} {
		if resp, _ := r.doLine([]byte(line + "\n")); resp.OK || resp.Errno != "EINVAL" {
			t.Fatalf("%s: %+v, want EINVAL", line, resp)
		}
	}
}
