package ipc_test

import (
	"os"
	"testing"

	"github.com/gdsfs/gdsfs/ipc"
	"github.com/gdsfs/gdsfs/proto"
)

// TestHandoverKeepsADropMadeWhileLeased: a file dropped while its lease
// is open (no grant of it mapped, held only for the lease) is let go at
// that lease's release through a successor daemon, as it would be by the
// predecessor.
func TestHandoverKeepsADropMadeWhileLeased(t *testing.T) {
	f := newFixture(t, ipc.SharingShared)
	f.write(t, "a", pattern(100000, 1))
	r := dial(t, f.srv.Path())
	a, fds := r.do(proto.Request{Op: proto.OpAcquire, Path: "a"})
	if !a.OK || len(fds) == 0 {
		t.Fatalf("acquire: %+v", a)
	}
	if resp, _ := r.do(proto.Request{Op: proto.OpDrop, Generation: a.Generation, Device: a.Device}); !resp.OK {
		t.Fatalf("drop: %+v", resp)
	}
	b, _ := handOver(t, f, "a")
	f.srv.Abandon()
	go b.Serve()
	if resp, _ := r.do(proto.Request{Op: proto.OpRelease, Lease: a.Lease, Epoch: a.Epoch}); !resp.OK {
		t.Fatalf("release through the successor: %+v", resp)
	}
	if st, u := b.Stats(), ipc.UseOf(b, uint32(os.Getuid())); st.HeldFiles != 0 || st.HeldBytes != 0 || st.HoldingConnections != 0 || u.Files != 0 {
		t.Fatalf("every grant dropped and every lease released: %d files, %d bytes held on %d connections (uid %+v); want none",
			st.HeldFiles, st.HeldBytes, st.HoldingConnections, u)
	}
}

// TestDropPrivateCopies: with private sharing every grant of a file is a
// copy of its own; as many drops as grants, then the releases, let every
// copy go whichever copy each drop is counted against, on a connection
// that stays open.
func TestDropPrivateCopies(t *testing.T) {
	const n = 8
	f := newFixture(t, ipc.SharingPrivate)
	f.write(t, "a", pattern(64<<10, 1))
	r := dial(t, f.srv.Path())
	for round := range 3 {
		var gs []proto.Response
		for range n {
			g, fds := r.do(proto.Request{Op: proto.OpAcquire, Path: "a"})
			if !g.OK || g.Reuse || len(fds) == 0 {
				t.Fatalf("acquire: %+v with %d descriptors, want a private copy", g, len(fds))
			}
			for _, fd := range fds {
				fd.Close()
			}
			gs = append(gs, g)
		}
		if st := f.srv.Stats(); st.HeldFiles != n {
			t.Fatalf("round %d: %d copies held, want %d", round, st.HeldFiles, n)
		}
		// the peer unmaps every copy while its leases are open
		for _, g := range gs {
			if resp, _ := r.do(proto.Request{Op: proto.OpDrop, Generation: g.Generation, Device: g.Device}); !resp.OK {
				t.Fatalf("drop: %+v", resp)
			}
		}
		for _, g := range gs {
			if resp, _ := r.do(proto.Request{Op: proto.OpRelease, Lease: g.Lease, Epoch: g.Epoch}); !resp.OK {
				t.Fatalf("release: %+v", resp)
			}
		}
		if st := f.srv.Stats(); st.HeldFiles != 0 || st.HeldBytes != 0 || st.HoldingConnections != 0 {
			t.Fatalf("round %d: %d drops and releases of %d copies: %d files, %d bytes held on %d connections; want none",
				round, n, n, st.HeldFiles, st.HeldBytes, st.HoldingConnections)
		}
	}
}
