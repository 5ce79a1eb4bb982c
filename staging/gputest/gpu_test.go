package gputest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/gdsfs/gdsfs/gpu"
	"github.com/gdsfs/gdsfs/gpu/cuda"
	"github.com/gdsfs/gdsfs/internal/units"
	"github.com/gdsfs/gdsfs/staging"
)

func openGPU(t *testing.T) *cuda.Device {
	t.Helper()
	d, err := cuda.Open(0, gpu.Options{ChunkSize: 1 << 30}, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)))
	if err != nil {
		if os.Getenv("GDSFS_REQUIRE_GPU") == "1" {
			t.Fatalf("GDSFS_REQUIRE_GPU=1 but no CUDA device: %v", err)
		}
		t.Skipf("SKIPPED: no CUDA device: %v", err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func testDir(t *testing.T) string {
	dir := os.Getenv("GDSFS_TEST_DIR")
	if dir == "" {
		return t.TempDir()
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// sizes parses GDSFS_GPU_SIZES: "1KiB,7MiB+13".
func sizes(t *testing.T) []int64 {
	spec := os.Getenv("GDSFS_GPU_SIZES")
	if spec == "" {
		spec = "1KiB,1MiB+1,7MiB+13,1GiB,4GiB"
	}
	var out []int64
	for _, s := range strings.Split(spec, ",") {
		base, extra, _ := strings.Cut(s, "+")
		n, err := units.ParseSize(base)
		if err != nil {
			t.Fatal(err)
		}
		var e int64
		if extra != "" {
			fmt.Sscan(extra, &e)
		}
		out = append(out, int64(n)+e)
	}
	return out
}

// testFile writes (once) a file of n pseudo-random bytes in dir.
func testFile(t *testing.T, dir string, n int64) string {
	t.Helper()
	p := filepath.Join(dir, fmt.Sprintf("gpu-%d.bin", n))
	if st, err := os.Stat(p); err == nil && st.Size() == n {
		return p
	}
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r := rand.New(rand.NewPCG(uint64(n), 3))
	buf := make([]byte, 16<<20)
	for left := n; left > 0; {
		k := min(int64(len(buf)), left)
		for i := 0; i < int(k); i += 8 {
			v := r.Uint64()
			for j := 0; j < 8 && i+j < int(k); j++ {
				buf[i+j] = byte(v >> (8 * j))
			}
		}
		if _, err := f.Write(buf[:k]); err != nil {
			t.Fatal(err)
		}
		left -= k
	}
	return p
}

// verify compares every byte of region with the file, 64 MiB at a time.
func verify(t *testing.T, r gpu.Region, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	want := make([]byte, 64<<20)
	got := make([]byte, 64<<20)
	for off := int64(0); off < r.Size(); off += int64(len(want)) {
		n := int(min(int64(len(want)), r.Size()-off))
		if _, err := io.ReadFull(f, want[:n]); err != nil {
			t.Fatal(err)
		}
		if _, err := r.ReadAt(got[:n], off); err != nil {
			t.Fatalf("device read back at %d: %v", off, err)
		}
		if !bytes.Equal(got[:n], want[:n]) {
			i := 0
			for got[i] == want[i] {
				i++
			}
			t.Fatalf("%s: staged byte %d differs from the file", path, off+int64(i))
		}
	}
}

// newCache stages from src onto dev. With io.compat_mode off (cuFile
// only), io.direct_io is on, so cuFile is handed an O_DIRECT descriptor
// in compat mode as in gds mode; otherwise off.
func newCache(t *testing.T, dev gpu.Device, src, compat string) *staging.Cache {
	t.Helper()
	direct := staging.DirectOff
	if compat == staging.CompatOff {
		direct = staging.DirectOn
	}
	c, err := staging.New(context.Background(), staging.Config{
		Source: src,
		Options: staging.Options{Device: "cuda", GPUs: []int{0}, Capacity: units.Share{Percent: 50},
			ChunkSize: 1 << 30, Prefetch: "manual", PrefetchQueue: 16, PrefetchWorkers: 1},
		IO: staging.IOOptions{CompatMode: compat, GDSThreshold: 1 << 20, TaskSize: 16 << 20,
			BounceSize: 4 << 20, NumThreads: 12, DirectIO: direct},
		Devices: []gpu.Device{dev},
		Log:     zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// needCuFile returns the device's cuFile mode. Where cuFile does not load
// at all the test skips (saying why) unless GDSFS_REQUIRE_CUFILE=1; once
// cuFile is there, every error of it fails the test.
func needCuFile(t *testing.T, dev gpu.Device) string {
	t.Helper()
	cf, why := dev.CuFile()
	if cf == nil {
		if os.Getenv("GDSFS_REQUIRE_CUFILE") == "1" {
			t.Fatalf("GDSFS_REQUIRE_CUFILE=1 but cuFile is unavailable: %s", why)
		}
		t.Skipf("SKIPPED: cuFile unavailable: %s", why)
	}
	return cf.Mode()
}

// stageAndVerify stages every size with compat and checks path and bytes.
func stageAndVerify(t *testing.T, compat, wantPath string) {
	dev := openGPU(t)
	if wantPath == staging.PathCuFile {
		needCuFile(t, dev)
	}
	dir := testDir(t)
	c := newCache(t, dev, dir, compat)
	for _, n := range sizes(t) {
		p := testFile(t, dir, n)
		start := time.Now()
		l, err := c.Acquire(context.Background(), staging.Request{Rel: filepath.Base(p)})
		if err != nil {
			t.Fatalf("stage %d bytes: %v (cuFile in this VM: run cufile-compat.sh and set CUFILE_FORCE_COMPAT_MODE=true, see shared/device/README.md)", n, err)
		}
		took := time.Since(start)
		info := c.Entries()[0]
		for _, e := range c.Entries() {
			if e.Path == filepath.Base(p) {
				info = e
			}
		}
		want := wantPath
		if compat == staging.CompatAuto && n < 1<<20 {
			want = staging.PathPOSIX // below io.gds_threshold
		}
		if info.LoadPath != want {
			t.Fatalf("%d bytes took the %s path (%s), want %s", n, info.LoadPath, info.Note, want)
		}
		if info.LoadPath == staging.PathCuFile && !strings.Contains(info.Note, "read with O_DIRECT") {
			t.Fatalf("cuFile was not given an O_DIRECT descriptor: %q (GDSFS_TEST_DIR must be on a disk filesystem)", info.Note)
		}
		verify(t, l.Region(), p)
		t.Logf("%s %d bytes: %s path, %.2f GB/s staging, every byte verified (note: %s)",
			compat, n, info.LoadPath, float64(n)/took.Seconds()/1e9, info.Note)
		l.Release()
		c.Evict(filepath.Base(p))
	}
}

func TestPOSIXPathVerified(t *testing.T) { stageAndVerify(t, staging.CompatOn, staging.PathPOSIX) }

func TestCuFilePathVerified(t *testing.T) { stageAndVerify(t, staging.CompatOff, staging.PathCuFile) }

// TestGDSModeVerified: where cuFile reports gds (nvidia-fs loaded), the
// cuFile path runs GPUDirect Storage proper, through the O_DIRECT
// descriptor, and every byte is checked. Elsewhere it skips saying so.
func TestGDSModeVerified(t *testing.T) {
	dev := openGPU(t)
	if mode := needCuFile(t, dev); mode != "gds" {
		if os.Getenv("GDSFS_REQUIRE_GDS") == "1" {
			t.Fatalf("GDSFS_REQUIRE_GDS=1 but cuFile reports %s", mode)
		}
		t.Skipf("SKIPPED: cuFile reports %s mode (no nvidia-fs): GPUDirect Storage proper cannot run here", mode)
	}
	if os.Getenv("CUFILE_FORCE_COMPAT_MODE") == "true" {
		t.Fatal("CUFILE_FORCE_COMPAT_MODE=true: unset it to test gds mode")
	}
	stageAndVerify(t, staging.CompatOff, staging.PathCuFile)
}

// TestAutoPicksAndReports: auto takes cuFile where it runs in gds mode and
// registration works, and the POSIX path otherwise (cuFile's compat mode
// included), saying why and counting the fallback.
func TestAutoPicksAndReports(t *testing.T) {
	want := os.Getenv("GDSFS_EXPECT_AUTO")
	if want == "" {
		t.Skip("SKIPPED: GDSFS_EXPECT_AUTO (posix or cufile) not set: the expected pick depends on the machine")
	}
	dev := openGPU(t)
	dir := testDir(t)
	c := newCache(t, dev, dir, staging.CompatAuto)
	p := testFile(t, dir, 64<<20)
	info, err := c.Stage(context.Background(), filepath.Base(p))
	if err != nil {
		t.Fatal(err)
	}
	cf, why := dev.CuFile()
	mode := "unavailable: " + why
	if cf != nil {
		mode = cf.Mode()
	}
	t.Logf("cufile mode %q; auto took %s; note %q; last cuFile error %q", mode, info.LoadPath, info.Note, c.Stats().CuFileLastError)
	if info.LoadPath != want {
		t.Fatalf("auto took %s, want %s (note %q)", info.LoadPath, want, info.Note)
	}
	if want == staging.PathPOSIX && !strings.Contains(info.Note, "cuFile") {
		t.Fatalf("auto fell back without saying why: note %q", info.Note)
	}
	if want == staging.PathPOSIX && cf != nil && c.Stats().CuFileFallbacks != 1 {
		t.Fatalf("fallback not counted: %+v", c.Stats())
	}
}

type gpuDevice = gpu.Device

func sharePercent(p float64) units.Share { return units.Share{Percent: p} }
