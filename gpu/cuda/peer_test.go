package cuda

import (
	"bytes"
	"os"
	"testing"

	"go.uber.org/zap/zaptest"

	"github.com/gdsfs/gdsfs/gpu"
)

// The peer copy path (cuMemcpyPeerAsync on a stream of the destination's
// context) with the source and destination on one device: a
// device-to-device copy through the very code a copy between two GPUs
// runs, so any GPU machine exercises it.
func TestPeerCopySameDevice(t *testing.T) {
	d, g := smallChunks(t)
	if ok, why := d.PeerAccess(d); !ok {
		t.Fatalf("a device has no access to itself: %s", why)
	}
	const size = 9<<20 + 3
	data := randomBytes(t, size)
	src := alloc(t, d, size)
	fill(t, d, src, data, 1<<20)
	dst := alloc(t, d, size)
	// Two shares, as a split ingest copies them, crossing chunk borders.
	half := gpu.RoundUp(size/2, g) + 7
	for _, sp := range [][2]int64{{0, half}, {half, size}} {
		if err := d.CopyRange(dst, sp[0], src, sp[0], sp[1]-sp[0]); err != nil {
			t.Fatalf("CopyRange [%d, %d): %v", sp[0], sp[1], err)
		}
	}
	if got := readAll(t, dst, size); !bytes.Equal(got, data) {
		t.Fatal("the peer copy differs from the source")
	}
	for name, call := range map[string]func() error{
		"foreign destination": func() error { return d.CopyRange(otherRegion{}, 0, src, 0, 1) },
		"foreign source":      func() error { return d.CopyRange(dst, 0, otherRegion{}, 0, 1) },
		"past the source":     func() error { return d.CopyRange(dst, 0, src, 1, size) },
		"negative":            func() error { return d.CopyRange(dst, -1, src, 0, 1) },
	} {
		if err := call(); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

// openOrdinal opens CUDA device ordinal for a two-GPU test.
func openOrdinal(t *testing.T, ordinal int) *Device {
	t.Helper()
	d, err := Open(ordinal, gpu.Options{}, zaptest.NewLogger(t))
	if err != nil {
		t.Fatalf("open GPU %d: %v", ordinal, err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// needTwoGPUs skips, loudly, where fewer than two GPUs answer (a failure
// without any GPU under GDSFS_REQUIRE_GPU=1).
func needTwoGPUs(t *testing.T) {
	t.Helper()
	openOrSkip(t)
	if n, err := deviceCount(); err != nil || n < 2 {
		t.Skipf("SKIPPED: needs 2 GPUs (%d here, %v)", n, err)
	}
}

// A replica copied between two GPUs both ways, and the topology report
// of the pair.
func TestPeerCopyTwoGPUs(t *testing.T) {
	needTwoGPUs(t)
	a, b := openOrdinal(t, 0), openOrdinal(t, 1)
	ok, why := a.PeerAccess(b)
	r := Check()
	if len(r.Peers) == 0 {
		t.Fatal("the topology report lists no pair")
	}
	p := r.Peers[0]
	t.Logf("pair 0-1: %s", p.Summary())
	if ok != p.Access() {
		t.Errorf("PeerAccess says %v (%s), the report %v", ok, why, p.Access())
	}
	if !ok {
		t.Skipf("SKIPPED: GPUs 0 and 1 have no peer access (%s): replicas are staged from host there", why)
	}
	const size = 64<<20 + 5
	data := randomBytes(t, size)
	ra := alloc(t, a, size)
	fill(t, a, ra, data, 4<<20)
	rb := alloc(t, b, size)
	if err := b.CopyRange(rb, 0, ra, 0, size); err != nil {
		t.Fatalf("copy GPU 0 -> 1: %v", err)
	}
	if got := readAll(t, rb, size); !bytes.Equal(got, data) {
		t.Fatal("GPU 1's copy differs")
	}
	rc := alloc(t, a, size)
	if err := a.CopyRange(rc, 0, rb, 0, size); err != nil {
		t.Fatalf("copy GPU 1 -> 0: %v", err)
	}
	if got := readAll(t, rc, size); !bytes.Equal(got, data) {
		t.Fatal("the copy back to GPU 0 differs")
	}
}

// The topology report lists every pair once (none with one GPU, or none).
func TestTopologyPairs(t *testing.T) {
	r := Check()
	n := len(r.Devices)
	if r.Peers == nil || len(r.Peers) != n*(n-1)/2 {
		t.Fatalf("%d devices, %d pairs: %+v", n, len(r.Peers), r.Peers)
	}
	if os.Getenv("GDSFS_REQUIRE_GPU") == "1" && n == 0 {
		t.Fatal("GDSFS_REQUIRE_GPU=1 but the report lists no device")
	}
}

func TestNVLinkNames(t *testing.T) {
	for _, tc := range []struct {
		l    nvlinks
		want string
	}{
		{nvlinks{direct: 4}, "NV4"},
		{nvlinks{switchA: 18, switchB: 18, p2p: true}, "NV18 through NVSwitch"},
		{nvlinks{p2p: true}, "NVLink (link count unknown)"},
		{nvlinks{}, "PCIe or unknown (NVML finds no NVLink between them)"},
	} {
		if got := tc.l.String(); got != tc.want {
			t.Errorf("%+v: %q, want %q", tc.l, got, tc.want)
		}
	}
}
