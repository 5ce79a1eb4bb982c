package ipc_test

import (
	"errors"
	"syscall"
	"testing"

	"github.com/gdsfs/gdsfs/client"
	"github.com/gdsfs/gdsfs/internal/units"
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
	b.Close() // kept
	// afresh, on the pool's one connection
	a2, err := client.Open("/mnt/gds/a")
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

// TestDropUnderOneDeviceNameKeepsTheOther: one file leased under two
// spellings of its device (none named, and the device the daemon placed
// it on) is two mappings of the process on its pooled connection, of one
// held generation there. Undoing the one the daemon did not let it keep
// must not make the daemon let go of the bytes the other, kept, still
// maps.
func TestDropUnderOneDeviceNameKeepsTheOther(t *testing.T) {
	f := start(t, ipc.SharingShared, setup{opts: func(o *ipc.Options) {
		o.MaxHeldPerUID = units.Share{Bytes: 1 << 20}
		o.CacheHeadroom = units.Share{Bytes: 512 << 10} // kept while the uid holds 512 KiB or less
	}})
	useSocket(t, f)
	f.write(t, "a", pattern(64<<10, 1))
	f.write(t, "c", pattern(512<<10, 2))
	anyDev, err := client.Open("/mnt/gds/a", client.OnDevice(""))
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.Open("/mnt/gds/c") // on the same connection: past the headroom
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	named, err := client.Open("/mnt/gds/a", client.OnDevice(anyDev.Device()))
	if err != nil {
		t.Fatal(err)
	}
	if named.Generation() != anyDev.Generation() || named.Device() != anyDev.Device() {
		t.Fatalf("two leases of a: generation %d on %s, then %d on %s", anyDev.Generation(), anyDev.Device(), named.Generation(), named.Device())
	}
	if st := f.srv.Stats(); st.OpenConnections != 1 || st.HeldFiles != 2 {
		t.Fatalf("%d connections holding %d files; want 1 holding 2", st.OpenConnections, st.HeldFiles)
	}
	anyDev.Close() // kept (granted with room to keep it)
	named.Close()  // not kept: undone
	// on the same connection: reads the answers of what was sent before
	again, err := client.Open("/mnt/gds/a", client.OnDevice(""))
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if !again.Reused() {
		t.Fatalf("a again: a full grant; the kept mapping of a was no longer held by the daemon (%d files held)", f.srv.Stats().HeldFiles)
	}
}
