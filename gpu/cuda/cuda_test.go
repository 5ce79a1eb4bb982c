package cuda

import (
	"crypto/rand"
	"errors"
	"io"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.uber.org/zap/zaptest"

	"github.com/gdsfs/gdsfs/gpu"
)

// openOrSkip opens device 0, skipping the test where no GPU answers unless
// GDSFS_REQUIRE_GPU=1, where that is a failure. The device closes at the end
// of the test.
func openOrSkip(t *testing.T) *Device {
	t.Helper()
	return openWith(t, gpu.Options{})
}

// openWith is openOrSkip with options.
func openWith(t *testing.T, opts gpu.Options) *Device {
	t.Helper()
	d, err := Open(0, opts, zaptest.NewLogger(t))
	if err != nil {
		if os.Getenv("GDSFS_REQUIRE_GPU") == "1" {
			t.Fatalf("GDSFS_REQUIRE_GPU=1 but no CUDA device: %v", err)
		}
		t.Skipf("SKIPPED: no CUDA device: %v", err)
	}
	t.Cleanup(func() {
		if err := d.Close(); err != nil {
			t.Errorf("close device: %v", err)
		}
	})
	return d
}

// smallChunks is an Options whose chunks are two granules, so a few MiB
// already spans several chunks.
func smallChunks(t *testing.T) (*Device, int64) {
	t.Helper()
	d := openOrSkip(t)
	g := d.Granularity()
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	return openWith(t, gpu.Options{ChunkSize: 2 * g}), g
}

func alloc(t *testing.T, d *Device, size int64) *Region {
	t.Helper()
	r, err := d.Alloc(size)
	if err != nil {
		t.Fatalf("Alloc(%d): %v", size, err)
	}
	t.Cleanup(func() {
		if err := r.Free(); err != nil {
			t.Errorf("free: %v", err)
		}
	})
	return r.(*Region)
}

func randomBytes(t *testing.T, n int) []byte {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// fill copies data into r at 0 through a worker, double-buffered.
func fill(t *testing.T, d *Device, r gpu.Region, data []byte, bufSize int) {
	t.Helper()
	gw, err := d.NewWorker(bufSize)
	if err != nil {
		t.Fatalf("NewWorker: %v", err)
	}
	w := gw.(*Worker)
	for k, off := 0, 0; off < len(data); k, off = k+1, off+bufSize {
		i := k % 2
		if err := w.Wait(i); err != nil {
			t.Fatalf("Wait(%d): %v", i, err)
		}
		n := copy(w.Buffer(i), data[off:])
		if err := w.CopyAsync(r, int64(off), i, n); err != nil {
			t.Fatalf("CopyAsync at %d: %v", off, err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatalf("worker close: %v", err)
	}
}

func readAll(t *testing.T, r io.ReaderAt, n int64) []byte {
	t.Helper()
	got := make([]byte, n)
	if m, err := r.ReadAt(got, 0); err != nil || int64(m) != n {
		t.Fatalf("ReadAt(%d bytes) = %d, %v", n, m, err)
	}
	return got
}

// TestOpenWithoutDriver passes on any machine: where Open fails, the error
// names the library or the CUDA error, and nothing panics.
func TestOpenWithoutDriver(t *testing.T) {
	d, err := Open(0, gpu.Options{}, nil)
	if err == nil {
		t.Logf("a CUDA device answered: %s", d.Name())
		if err := d.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
		return
	}
	t.Logf("Open: %v", err)
	msg := err.Error()
	if !strings.Contains(msg, "libcuda.so.1") && !strings.Contains(msg, "CUDA_ERROR") &&
		!strings.Contains(msg, "CUresult") && !strings.Contains(msg, "does not exist") {
		t.Errorf("Open error %q names neither libcuda.so.1 nor a CUDA error", msg)
	}
	if _, err := Open(0, gpu.Options{}, nil); err == nil || err.Error() != msg {
		t.Errorf("second Open: %v, want the same error", err)
	}
	rep := Check()
	t.Logf("check:\n%s", rep)
	if loadErr := loadCUDA(); loadErr != nil {
		if rep.Error != loadErr.Error() || !strings.HasPrefix(rep.CuFile.Mode, "unavailable: ") {
			t.Errorf("Check = %+v, want error %q and cufile unavailable", rep, loadErr)
		}
	}
}

func TestOpenRejectsNegativeChunkSize(t *testing.T) {
	if _, err := Open(0, gpu.Options{ChunkSize: -1}, nil); err == nil {
		t.Fatal("Open with ChunkSize -1 succeeded")
	}
}

func TestFormatUUID(t *testing.T) {
	u := [16]byte{0x5b, 0x3f, 0xa3, 0xd2, 0x01, 0x02, 0x03, 0x04, 0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff, 0x00, 0x11}
	if got, want := formatUUID(u), "GPU-5b3fa3d2-0102-0304-aabb-ccddeeff0011"; got != want {
		t.Errorf("formatUUID = %q, want %q", got, want)
	}
}

func TestCuFileCandidatesNewestFirst(t *testing.T) {
	got := []string{"/usr/local/cuda-9.2/x", "/usr/local/cuda-13.0/x", "/usr/local/cuda-12.10/x", "/usr/local/cuda-12.9/x"}
	slices.SortFunc(got, func(a, b string) int { return compareVersions(b, a) })
	want := []string{"/usr/local/cuda-13.0/x", "/usr/local/cuda-12.10/x", "/usr/local/cuda-12.9/x", "/usr/local/cuda-9.2/x"}
	if !slices.Equal(got, want) {
		t.Errorf("order %v, want %v", got, want)
	}
	if c := cufileCandidates(); c[0] != "libcufile.so.0" {
		t.Errorf("first candidate %q", c[0])
	}
}

func TestCuFileStatusText(t *testing.T) {
	for code, want := range map[int]string{
		5018: "CU_FILE_INVALID_FILE_TYPE (5018): unsupported file type",
		5027: "CU_FILE_HANDLE_NOT_REGISTERED (5027): file descriptor is not registered",
		5001: "CU_FILE_DRIVER_NOT_INITIALIZED (5001)",
		9999: "unknown cuFile status (9999)",
	} {
		if got := cufileStatusText(code); !strings.HasPrefix(got, want) {
			t.Errorf("cufileStatusText(%d) = %q, want prefix %q", code, got, want)
		}
	}
	err := &cuFileError{op: "cuFileHandleRegister", code: 5018}
	if !strings.Contains(err.Error(), "cuFileHandleRegister: CU_FILE_INVALID_FILE_TYPE") {
		t.Errorf("error text %q", err)
	}
	if e := readError(-5027, 0, 0); !strings.Contains(e.Error(), "CU_FILE_HANDLE_NOT_REGISTERED") {
		t.Errorf("readError(-5027) = %v", e)
	}
	if e := readError(-1, 5, 0); !strings.Contains(e.Error(), "input/output error") {
		t.Errorf("readError(-1, EIO) = %v", e)
	}
}

func TestOutOfMemoryUnwraps(t *testing.T) {
	err := error(&cudaError{op: "cuMemCreate", code: cudaErrorOutOfMemory, name: "CUDA_ERROR_OUT_OF_MEMORY"})
	if !errors.Is(err, gpu.ErrOutOfMemory) {
		t.Errorf("%v does not unwrap to gpu.ErrOutOfMemory", err)
	}
	if errors.Is(&cudaError{code: 1}, gpu.ErrOutOfMemory) {
		t.Error("CUDA_ERROR_INVALID_VALUE unwraps to gpu.ErrOutOfMemory")
	}
}

func TestDeviceIdentity(t *testing.T) {
	d := openOrSkip(t)
	if d.Kind() != gpu.KindCUDA || d.Ordinal() != 0 {
		t.Errorf("Kind %q Ordinal %d", d.Kind(), d.Ordinal())
	}
	if !regexp.MustCompile(`^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`).MatchString(d.Name()) {
		t.Errorf("Name %q is not GPU-<uuid>", d.Name())
	}
	if g := d.Granularity(); g <= 0 || g&(g-1) != 0 {
		t.Errorf("granularity %d is not a power of two", g)
	}
	free, total, err := d.MemInfo()
	if err != nil || free <= 0 || total < free {
		t.Errorf("MemInfo = %d, %d, %v", free, total, err)
	}
	cf, reason := d.CuFile()
	if cf != nil {
		t.Logf("%s (%s): granularity %d, cufile %s", d.Name(), d.Model(), d.Granularity(), cf.Mode())
	} else {
		t.Logf("%s (%s): granularity %d, cufile unavailable: %s", d.Name(), d.Model(), d.Granularity(), reason)
	}
	rep := Check()
	t.Logf("check:\n%s", rep)
	if rep.DeviceCount < 1 || rep.Devices[0].UUID != d.Name() || rep.Devices[0].TotalMemory != total {
		t.Errorf("Check devices %+v, want device 0 = %s with %d bytes", rep.Devices, d.Name(), total)
	}
}

func TestAllocFree(t *testing.T) {
	d, g := smallChunks(t)
	for _, size := range []int64{0, 1, g - 1, g, g + 1, 2 * g, 3*g + 5, 7*g - 1} {
		r := alloc(t, d, size)
		chunks := r.Chunks()
		var sum int64
		for _, c := range chunks {
			if c%g != 0 || c > 2*g || c <= 0 {
				t.Errorf("size %d: chunk %d is not a multiple of %d up to %d", size, c, g, 2*g)
			}
			sum += c
		}
		if r.Size() != size || sum < max(size, 1) || sum-max(size, 1) >= g {
			t.Errorf("size %d: Size %d, chunks %v", size, r.Size(), chunks)
		}
		if r.DevicePtr() == 0 {
			t.Errorf("size %d: no device pointer", size)
		}
		if err := r.Seal(); err != nil {
			t.Error(err)
		}
		if err := r.Free(); err != nil {
			t.Errorf("size %d: Free: %v", size, err)
		}
		if err := r.Free(); err != nil {
			t.Errorf("size %d: second Free: %v", size, err)
		}
		if _, err := r.ReadAt(make([]byte, 1), 0); size > 0 && err == nil {
			t.Errorf("size %d: ReadAt after Free succeeded", size)
		}
	}
	if _, err := d.Alloc(-1); err == nil {
		t.Error("Alloc(-1) succeeded")
	}
}

func TestAllocOutOfMemory(t *testing.T) {
	d := openWith(t, gpu.Options{ChunkSize: 1 << 40})
	free, total, err := d.MemInfo()
	if err != nil {
		t.Fatal(err)
	}
	g := d.Granularity()
	// More than the device has is refused before the driver is asked; all
	// of it (more than is free) is refused by cuMemCreate.
	for _, size := range []int64{2 * total, total / g * g} {
		if size <= free {
			t.Logf("skip %d bytes: not more than the %d free", size, free)
			continue
		}
		r, err := d.Alloc(size)
		if err == nil {
			r.Free()
			t.Fatalf("Alloc(%d) with %d bytes free succeeded", size, free)
		}
		if !errors.Is(err, gpu.ErrOutOfMemory) {
			t.Errorf("Alloc(%d): %v, want gpu.ErrOutOfMemory", size, err)
		}
		t.Logf("Alloc(%d): %v", size, err)
	}
}
