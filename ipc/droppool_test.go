package ipc_test

import (
	"errors"
	"syscall"
	"testing"

	"github.com/gdsfs/gdsfs/client"
	"github.com/gdsfs/gdsfs/ipc"
)

// TestDropOfStaleMappingKeepsTheKeptOne: a mapping made stale (its
// repeat lease refused) and a fresh mapping of the same file, leased
// afresh on the same pooled connection, name one held generation there.
// Undoing the stale one must not make the daemon let go of the bytes the
// kept fresh one still maps: the daemon holds what the process maps, and
// the kept mapping is leased again with no descriptors.
func TestDropOfStaleMappingKeepsTheKeptOne(t *testing.T) {
	f := start(t, ipc.SharingShared, setup{opts: func(o *ipc.Options) { o.MaxLeasesPerUID = 2 }})
	useSocket(t, f)
	f.write(t, "a", pattern(4096, 1))
	f.write(t, "b", pattern(4096, 2))
	a1, err := client.Open("/mnt/gds/a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := client.Open("/mnt/gds/b")
	if err != nil {
		t.Fatal(err)
	}
	// a third lease passes ipc.max_leases_per_uid: the repeat lease of a
	// fails and its mapping (a1's) is never handed out again
	if _, err := client.Open("/mnt/gds/a"); !errors.Is(err, syscall.EDQUOT) {
		t.Fatalf("a third lease: %v, want EDQUOT", err)
	}
	b.Close()                            // kept
	a2, err := client.Open("/mnt/gds/a") // afresh, on the pool's one connection
	if err != nil {
		t.Fatal(err)
	}
	if a2.Generation() != a1.Generation() {
		t.Fatalf("a changed: generation %d, then %d", a1.Generation(), a2.Generation())
	}
	a2.Close() // kept: the current mapping of a
	a1.Close() // the stale mapping of a: undone
	// a repeat lease of b on the same connection reads the answers of a1's
	// release and drop first
	b2, err := client.Open("/mnt/gds/b")
	if err != nil || !b2.Reused() {
		t.Fatalf("b again: %v", err)
	}
	defer b2.Close()
	if st := f.srv.Stats(); st.OpenConnections != 1 || st.HeldFiles != 2 {
		t.Fatalf("%d connections holding %d files; want 1 holding 2 (a, mapped and kept, and b)", st.OpenConnections, st.HeldFiles)
	}
	a3, err := client.Open("/mnt/gds/a")
	if err != nil {
		t.Fatal(err)
	}
	defer a3.Close()
	if !a3.Reused() {
		t.Fatal("a again: a full grant; the kept mapping of a was no longer held by the daemon")
	}
}
