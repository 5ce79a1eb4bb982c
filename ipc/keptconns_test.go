package ipc_test

import (
	"errors"
	"fmt"
	"syscall"
	"testing"

	"github.com/gdsfs/gdsfs/client"
	"github.com/gdsfs/gdsfs/ipc"
)

// TestClientKeepsFewConnections: a process that leased file after file
// and closed each keeps only a few connections (16) open for repeat
// leases, not hundreds of the uid's ipc.max_connections_per_uid.
func TestClientKeepsFewConnections(t *testing.T) {
	f := newFixture(t, ipc.SharingShared)
	useSocket(t, f)
	const n, kept = 24, 16
	for i := range n {
		f.write(t, fmt.Sprintf("k%d", i), pattern(4096, i))
		l, err := client.Open(fmt.Sprintf("/mnt/gds/k%d", i))
		if err != nil {
			t.Fatal(err)
		}
		l.Close()
	}
	f.waitClosed(t, n-kept)
	if st := f.srv.Stats(); st.OpenConnections != kept {
		t.Fatalf("%d connections open after %d leases closed; want %d kept", st.OpenConnections, n, kept)
	}
}

// TestClientDropsKeptAtLimit: a lease refused because the uid is at
// ipc.max_connections_per_uid makes the client drop the mappings it kept
// for repeat leases, closing their connections.
func TestClientDropsKeptAtLimit(t *testing.T) {
	f := start(t, ipc.SharingShared, setup{opts: func(o *ipc.Options) { o.MaxConnectionsPerUID = 4 }})
	useSocket(t, f)
	for i := range 5 {
		f.write(t, fmt.Sprintf("l%d", i), pattern(4096, i))
	}
	for i := range 4 {
		l, err := client.Open(fmt.Sprintf("/mnt/gds/l%d", i))
		if err != nil {
			t.Fatal(err)
		}
		l.Close() // kept, its connection open
	}
	if _, err := client.Open("/mnt/gds/l4"); !errors.Is(err, syscall.EMFILE) {
		t.Fatalf("a fifth connection: %v, want EMFILE", err)
	}
	f.waitClosed(t, 4)
	if st := f.srv.Stats(); st.OpenConnections != 0 || st.HeldFiles != 0 {
		t.Fatalf("after the refusal: %d connections, %d files held; want none", st.OpenConnections, st.HeldFiles)
	}
}
