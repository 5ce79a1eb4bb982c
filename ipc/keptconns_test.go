package ipc_test

import (
	"fmt"
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
