package ipc_test

import (
	"fmt"
	"testing"

	"github.com/gdsfs/gdsfs/client"
	"github.com/gdsfs/gdsfs/ipc"
	"github.com/gdsfs/gdsfs/proto"
)

// TestClientLeasesFileAfterFileOnOneConnection: a process that leased
// file after file and closed each keeps them mapped on one connection,
// not a share of the uid's ipc.max_connections_per_uid, and leases them
// again from it.
func TestClientLeasesFileAfterFileOnOneConnection(t *testing.T) {
	f := newFixture(t, ipc.SharingShared)
	useSocket(t, f)
	const n = 24
	for i := range n {
		f.write(t, fmt.Sprintf("k%d", i), pattern(4096, i))
		l, err := client.Open(fmt.Sprintf("/mnt/gds/k%d", i))
		if err != nil {
			t.Fatal(err)
		}
		l.Close()
	}
	if st := f.srv.Stats(); st.OpenConnections != 1 || st.HeldFiles != n {
		t.Fatalf("%d connections open holding %d files after %d leases closed; want 1 holding %d", st.OpenConnections, st.HeldFiles, n, n)
	}
	for i := range n {
		l, err := client.Open(fmt.Sprintf("/mnt/gds/k%d", i))
		if err != nil || !l.Reused() {
			t.Fatalf("k%d again: %v, reused %v", i, err, err == nil && l.Reused())
		}
		l.Close()
	}
}

// TestClientDropsWhatItUnmaps: a kept mapping undone while its
// connection stays open (a lease on it is still open) is dropped there:
// the daemon holds only what the process still maps.
func TestClientDropsWhatItUnmaps(t *testing.T) {
	f := newFixture(t, ipc.SharingShared)
	useSocket(t, f)
	f.write(t, "a", pattern(4096, 1))
	f.write(t, "b", pattern(4096, 2))
	a, err := client.Open("/mnt/gds/a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := client.Open("/mnt/gds/b")
	if err != nil {
		t.Fatal(err)
	}
	b.Close()
	client.DropCache() // undoes b's kept mapping; a's lease keeps the connection
	if resp, _ := dial(t, f.srv.Path()).do(waitStatReq(proto.StatHeldFiles, 1, 10000)); !resp.OK {
		t.Fatalf("b unmapped: %+v (held files %d, want 1)", resp, f.srv.Stats().HeldFiles)
	}
	if st := f.srv.Stats(); st.OpenConnections != 2 { // with the wait_stat's own
		t.Fatalf("%d connections open, want 2", st.OpenConnections)
	}
	a.Close()
	client.DropCache()
	f.waitClosed(t, 1)
}
