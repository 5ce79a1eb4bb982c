package cuda

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/gdsfs/gdsfs/client/chunkmap"
	"github.com/gdsfs/gdsfs/gpu"
)

func TestWorkerCopy(t *testing.T) {
	d, g := smallChunks(t)
	const size = 64<<20 + 12345
	data := randomBytes(t, size)
	r := alloc(t, d, size)
	if len(r.Chunks()) < 2 {
		t.Fatalf("%d bytes in chunks of %d made %v", size, 2*g, r.Chunks())
	}
	fill(t, d, r, data, 4<<20+7)
	if got := readAll(t, r, size); !bytes.Equal(got, data) {
		t.Fatal("device bytes differ from what was copied")
	}
	// Small (direct) and unaligned reads, and reads past the end.
	for _, tc := range []struct{ off, n int }{{0, 1}, {int(g) - 3, 7}, {size - 10, 10}, {12345, 3 << 20}} {
		got := make([]byte, tc.n)
		if n, err := r.ReadAt(got, int64(tc.off)); err != nil || n != tc.n || !bytes.Equal(got, data[tc.off:tc.off+tc.n]) {
			t.Errorf("ReadAt(%d bytes at %d) = %d, %v (equal %v)", tc.n, tc.off, n, err, bytes.Equal(got, data[tc.off:tc.off+tc.n]))
		}
	}
	if n, err := r.ReadAt(make([]byte, 20), size-10); n != 10 || err != io.EOF {
		t.Errorf("ReadAt across the end = %d, %v, want 10, EOF", n, err)
	}
	if n, err := r.ReadAt(make([]byte, 1), size); n != 0 || err != io.EOF {
		t.Errorf("ReadAt at the end = %d, %v, want 0, EOF", n, err)
	}
}

// otherRegion is a gpu.Region of some other backend.
type otherRegion struct{ gpu.Region }

func TestWorkerRejects(t *testing.T) {
	d := openOrSkip(t)
	r := alloc(t, d, 1<<20)
	w, err := d.NewWorker(1 << 16)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	for name, call := range map[string]func() error{
		"foreign region": func() error { return w.CopyAsync(otherRegion{}, 0, 0, 1) },
		"nil region":     func() error { return w.CopyAsync(nil, 0, 0, 1) },
		"negative off":   func() error { return w.CopyAsync(r, -1, 0, 1) },
		"past the end":   func() error { return w.CopyAsync(r, 1<<20-10, 0, 11) },
		"n > buffer":     func() error { return w.CopyAsync(r, 0, 1, 1<<16+1) },
		"buffer 2":       func() error { return w.CopyAsync(r, 0, 2, 1) },
		"wait 2":         func() error { return w.Wait(2) },
	} {
		if err := call(); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	if w.Buffer(2) != nil || len(w.Buffer(1)) != 1<<16 {
		t.Error("Buffer(2) is not nil or Buffer(1) has the wrong size")
	}
	if err := w.CopyAsync(r, 1<<20-10, 1, 10); err != nil {
		t.Errorf("copy to the last bytes: %v", err)
	}
	if err := w.Wait(1); err != nil {
		t.Errorf("Wait: %v", err)
	}
	if _, err := d.NewWorker(0); err == nil {
		t.Error("NewWorker(0) succeeded")
	}
}

func TestCopyDeviceToDevice(t *testing.T) {
	d, _ := smallChunks(t)
	const size = 9<<20 + 3
	data := randomBytes(t, size)
	src := alloc(t, d, size)
	fill(t, d, src, data, 1<<20)
	dst := alloc(t, d, size+5)
	if err := d.Copy(dst, src); err != nil {
		t.Fatalf("Copy: %v", err)
	}
	if got := readAll(t, dst, size); !bytes.Equal(got, data) {
		t.Fatal("copy differs from source")
	}
	small := alloc(t, d, size-1)
	if err := d.Copy(small, src); err == nil {
		t.Error("Copy into a smaller region succeeded")
	}
	if err := d.Copy(otherRegion{}, src); err == nil {
		t.Error("Copy into a foreign region succeeded")
	}
}

// exported fills a multi-chunk region with random bytes and exports it.
func exported(t *testing.T) (*Device, *Region, []byte, []*os.File) {
	t.Helper()
	d, _ := smallChunks(t)
	const size = 13<<20 + 77
	data := randomBytes(t, size)
	r := alloc(t, d, size)
	fill(t, d, r, data, 2<<20)
	files, err := r.Export()
	if err != nil {
		t.Fatalf("Export: %v", err)
	}
	t.Cleanup(func() {
		for _, f := range files {
			f.Close()
		}
	})
	if len(files) != len(r.Chunks()) {
		t.Fatalf("%d files for %d chunks", len(files), len(r.Chunks()))
	}
	return d, r, data, files
}

// chunksTotal is the number of bytes r's chunks hold, the size a mapping
// of all of them has.
func chunksTotal(r gpu.Region) int64 {
	var total int64
	for _, c := range r.Chunks() {
		total += c
	}
	return total
}

func TestExportMapSameProcess(t *testing.T) {
	d, r, data, files := exported(t)
	total := chunksTotal(r)
	m, err := chunkmap.CUDA(d.Name(), files, r.Chunks(), total, false)
	if err != nil {
		t.Fatalf("Map: %v", err)
	}
	if m.Ptr() == 0 || m.Ptr() == r.DevicePtr() {
		t.Errorf("mapping pointer %#x, region %#x", m.Ptr(), r.DevicePtr())
	}
	if m.Size() != total {
		t.Errorf("mapping size %d, chunks hold %d", m.Size(), total)
	}
	if got := readAll(t, m, int64(len(data))); !bytes.Equal(got, data) {
		t.Fatal("mapped bytes differ")
	}
	if err := m.Close(); err != nil {
		t.Fatalf("mapping Close: %v", err)
	}
	if err := m.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := chunkmap.CUDA("GPU-00000000-0000-0000-0000-000000000000", files, r.Chunks(), total, false); err == nil {
		t.Error("Map on an unknown device succeeded")
	}
}

// TestImportExportsAgain: a region imported from another's exported
// descriptors (a successor adopting a predecessor's cache) holds the
// bytes after the exporter freed its own handles, and exports them again
// to consumers (the driver refuses to export an imported handle, so the
// descriptors it came from are handed out).
func TestImportExportsAgain(t *testing.T) {
	d, r, data, files := exported(t)
	im, err := d.Import(files, r.Chunks(), r.Size())
	if err != nil {
		t.Fatalf("Import: %v", err)
	}
	defer im.Free()
	if err := r.Free(); err != nil {
		t.Fatalf("Free of the exporter's region: %v", err)
	}
	got := make([]byte, len(data))
	if _, err := im.ReadAt(got, 0); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("imported region's bytes after the exporter freed its own: err %v, equal %v", err, bytes.Equal(got, data))
	}
	again, err := im.Export()
	if err != nil {
		t.Fatalf("Export of an imported region: %v", err)
	}
	defer func() {
		for _, f := range again {
			f.Close()
		}
	}()
	total := chunksTotal(im)
	m, err := chunkmap.CUDA(d.Name(), again, im.Chunks(), total, false)
	if err != nil {
		t.Fatalf("Map of the imported region's export: %v", err)
	}
	defer m.Close()
	if got := readAll(t, m, int64(len(data))); !bytes.Equal(got, data) {
		t.Fatal("bytes mapped from the imported region's export differ")
	}
}

// Environment of the child process TestExportMapChildProcess starts.
const (
	envChild  = "GDSFS_CUDA_TEST_CHILD"
	envDevice = "GDSFS_CUDA_TEST_DEVICE"
	envLens   = "GDSFS_CUDA_TEST_LENS"
	envSize   = "GDSFS_CUDA_TEST_SIZE"
)

// TestExportMapChildProcess proves cross-process import: a child process
// maps the exported fds it inherits and prints the sha256 of the bytes.
func TestExportMapChildProcess(t *testing.T) {
	d, r, data, files := exported(t)
	var lens []string
	for _, c := range r.Chunks() {
		lens = append(lens, strconv.FormatInt(c, 10))
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperChild$", "-test.v")
	cmd.Env = append(os.Environ(), envChild+"=1", envDevice+"="+d.Name(),
		envLens+"="+strings.Join(lens, ","), envSize+"="+strconv.Itoa(len(data)))
	cmd.ExtraFiles = files
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	sum := sha256.Sum256(data)
	want := "SHA256=" + hex.EncodeToString(sum[:])
	if !strings.Contains(string(out), want) {
		t.Fatalf("child output lacks %s:\n%s", want, out)
	}
}

// TestHelperChild is the child side of TestExportMapChildProcess.
func TestHelperChild(t *testing.T) {
	if os.Getenv(envChild) != "1" {
		t.Skip("helper for TestExportMapChildProcess")
	}
	var lens []int64
	var files []*os.File
	for i, s := range strings.Split(os.Getenv(envLens), ",") {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		lens = append(lens, n)
		files = append(files, os.NewFile(uintptr(3+i), fmt.Sprintf("chunk%d", i)))
	}
	size, err := strconv.ParseInt(os.Getenv(envSize), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	m, err := chunkmap.CUDA(os.Getenv(envDevice), files, lens, size, false)
	if err != nil {
		t.Fatalf("Map in child: %v", err)
	}
	defer m.Close()
	sum := sha256.Sum256(readAll(t, m, size))
	fmt.Printf("SHA256=%s\n", hex.EncodeToString(sum[:]))
}

func testDir(t *testing.T) string {
	if dir := os.Getenv("GDSFS_TEST_DIR"); dir != "" {
		d, err := os.MkdirTemp(dir, "cuda-test-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(d) })
		return d
	}
	return t.TempDir()
}

// skipCuFile skips a cuFile test when cuFile does not load at all (reason),
// unless GDSFS_REQUIRE_CUFILE=1.
func skipCuFile(t *testing.T, reason string) {
	t.Helper()
	if os.Getenv("GDSFS_REQUIRE_CUFILE") == "1" {
		t.Fatalf("GDSFS_REQUIRE_CUFILE=1 but %s", reason)
	}
	t.Skipf("SKIPPED: cuFile unusable: %s", reason)
}

func TestCuFileReadInto(t *testing.T) {
	d, g := smallChunks(t)
	cf, reason := d.CuFile()
	if cf == nil {
		skipCuFile(t, reason)
	}
	const size = 11<<20 + 4321
	data := randomBytes(t, size)
	path := filepath.Join(testDir(t), "data")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	// cuFile is given an O_DIRECT descriptor, as staging gives it (and
	// as GPUDirect Storage proper needs), in either mode.
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_DIRECT, 0)
	if err != nil {
		t.Fatalf("O_DIRECT open (GDSFS_TEST_DIR must be on a disk filesystem): %v", err)
	}
	defer f.Close()
	h, err := cf.Register(int(f.Fd()))
	if err != nil {
		// As the GPU machine comes (no udev entry for its disk) cuFile
		// refuses every file: a loud skip there, a failure once the
		// set-up was made (GDSFS_REQUIRE_CUFILE=1, test-gpu.sh).
		skipCuFile(t, fmt.Sprintf("cuFileHandleRegister of an O_DIRECT descriptor (%s mode): %v", cf.Mode(), err))
	}
	defer h.Close()
	r := alloc(t, d, size)
	for _, tc := range []struct{ dstOff, fileOff, n int64 }{
		{0, 0, 1 << 20},
		{3 << 12, 1<<20 + 4096, 2 << 20},
		{g - 100, 5 << 20, 300},          // crosses a chunk boundary, unaligned
		{0, 0, size},                     // whole file
		{size - 1000, size - 1000, 1000}, // unaligned tail
	} {
		n, err := h.ReadInto(r, tc.dstOff, tc.fileOff, int(tc.n))
		if err != nil || int64(n) != tc.n {
			t.Fatalf("ReadInto(dst %d, file %d, %d) = %d, %v", tc.dstOff, tc.fileOff, tc.n, n, err)
		}
		got := make([]byte, tc.n)
		if _, err := r.ReadAt(got, tc.dstOff); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, data[tc.fileOff:tc.fileOff+tc.n]) {
			t.Fatalf("ReadInto(dst %d, file %d, %d): bytes differ", tc.dstOff, tc.fileOff, tc.n)
		}
	}
	if n, err := h.ReadInto(r, size-10, size-10, 10); err != nil || n != 10 {
		t.Errorf("read the last 10 bytes: %d, %v", n, err)
	}
	if _, err := h.ReadInto(r, size-10, 0, 11); err == nil {
		t.Error("ReadInto past the region end succeeded")
	}
	if _, err := h.ReadInto(otherRegion{}, 0, 0, 1); err == nil {
		t.Error("ReadInto a foreign region succeeded")
	}
}

// TestCuFileStatsCountReads: cuFile's own statistics count a read into a
// region on this GPU, with its bytes, on the path the device's mode says.
func TestCuFileStatsCountReads(t *testing.T) {
	d := openOrSkip(t)
	cf, reason := d.CuFile()
	if cf == nil {
		skipCuFile(t, reason)
	}
	before, why := CuFileStatistics()
	if why != "" {
		skipCuFile(t, "cuFile statistics unavailable: "+why)
	}
	const size = 8<<20 + 4321
	path := filepath.Join(testDir(t), "data")
	if err := os.WriteFile(path, randomBytes(t, size), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_DIRECT, 0)
	if err != nil {
		t.Fatalf("O_DIRECT open (GDSFS_TEST_DIR must be on a disk filesystem): %v", err)
	}
	defer f.Close()
	h, err := cf.Register(int(f.Fd()))
	if err != nil {
		skipCuFile(t, fmt.Sprintf("cuFileHandleRegister of an O_DIRECT descriptor (%s mode): %v", cf.Mode(), err))
	}
	defer h.Close()
	r := alloc(t, d, size)
	if n, err := h.ReadInto(r, 0, 0, size); err != nil || n != size {
		t.Fatalf("ReadInto: %d, %v", n, err)
	}
	after, why := CuFileStatistics()
	if why != "" {
		t.Fatalf("statistics gone after a read: %s", why)
	}
	b, _ := before.GPU(d.Name(), 0)
	a, ok := after.GPU(d.Name(), 0)
	t.Logf("cuFile level %d, %s: before %+v, after %+v", after.Level, d.Name(), b, a)
	if after.Level < 3 {
		t.Skipf("SKIPPED: CUFILE_STATS_LEVEL=%d has no per-GPU counters", after.Level)
	}
	if !ok || a.ReadBytes-b.ReadBytes != size {
		t.Errorf("cuFile counted %d bytes read on %s, want %d", a.ReadBytes-b.ReadBytes, d.Name(), size)
	}
	want := map[string]string{"gds": "gds", "compat": "compat (posix)"}[cf.Mode()]
	if got := ReadPath(before, after, d.Name(), 0); got != want {
		t.Errorf("cuFile counted the read on path %q, want %q in %s mode", got, want, cf.Mode())
	}
}

// TestExportKeepsItsFirstDescriptors: a region exports each chunk once
// and hands out duplicates after (same open file, each one the caller's
// to close), every export maps the region's bytes, and Free closes the
// kept descriptors.
func TestExportKeepsItsFirstDescriptors(t *testing.T) {
	d, r, data, first := exported(t)
	kept := keptExports.Load()
	again, err := r.Export()
	if err != nil {
		t.Fatalf("second Export: %v", err)
	}
	defer closeFiles(again)
	if keptExports.Load() != kept {
		t.Errorf("kept descriptors %d after the second Export, %d after the first", keptExports.Load(), kept)
	}
	if len(r.exports) != len(r.Chunks()) {
		t.Fatalf("the region keeps %d descriptors for %d chunks", len(r.exports), len(r.Chunks()))
	}
	for i := range again {
		a, b := fstat(t, first[i]), fstat(t, again[i])
		if a.Ino != b.Ino || a.Dev != b.Dev || first[i].Fd() == again[i].Fd() {
			t.Errorf("chunk %d: the second export is not a new descriptor of the first's file", i)
		}
	}
	closeFiles(first) // the caller's copies: the region's own stay open
	m, err := chunkmap.CUDA(d.Name(), again, r.Chunks(), chunksTotal(r), false)
	if err != nil {
		t.Fatalf("Map of the second export: %v", err)
	}
	if got := readAll(t, m, int64(len(data))); !bytes.Equal(got, data) {
		t.Error("the second export maps other bytes")
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	own := r.exports
	if err := r.Free(); err != nil {
		t.Fatal(err)
	}
	if keptExports.Load() != kept-int64(len(own)) {
		t.Errorf("kept descriptors %d after Free, want %d", keptExports.Load(), kept-int64(len(own)))
	}
	for i, f := range own {
		if err := syscall.Fstat(int(f.Fd()), new(syscall.Stat_t)); err == nil {
			t.Errorf("chunk %d: the kept descriptor is open after Free", i)
		}
	}
}

// TestExportPastTheBoundIsNotKept: where the kept descriptors would pass
// keptExportsMax, Export hands out the exported descriptors themselves
// and keeps none.
func TestExportPastTheBoundIsNotKept(t *testing.T) {
	d, _ := smallChunks(t)
	r := alloc(t, d, 5<<20)
	keptExports.Add(keptExportsMax())
	defer keptExports.Add(-keptExportsMax())
	files, err := r.Export()
	if err != nil {
		t.Fatal(err)
	}
	defer closeFiles(files)
	if len(files) != len(r.Chunks()) || r.exports != nil {
		t.Errorf("%d descriptors for %d chunks, %d kept; want none kept", len(files), len(r.Chunks()), len(r.exports))
	}
}

func fstat(t *testing.T, f *os.File) syscall.Stat_t {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatalf("fstat %s: %v", f.Name(), err)
	}
	return st
}
