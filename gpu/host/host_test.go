package host

import (
	"bytes"
	"errors"
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/client/chunkmap"
	"github.com/gdsfs/gdsfs/gpu"
	"github.com/gdsfs/gdsfs/internal/testkit/testfiles"
)

// fill copies data into r through a worker, alternating bounce buffers.
func fill(t *testing.T, d *Device, r gpu.Region, data []byte) {
	t.Helper()
	w, err := d.NewWorker(5000)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	for i, off := 0, 0; off < len(data); i, off = i^1, off+5000 {
		if err := w.Wait(i); err != nil {
			t.Fatal(err)
		}
		n := copy(w.Buffer(i), data[off:])
		if err := w.CopyAsync(r, int64(off), i, n); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 2 {
		if err := w.Wait(i); err != nil {
			t.Fatal(err)
		}
	}
}

func TestRegionRoundTrip(t *testing.T) {
	d := Open(gpu.Options{ChunkSize: 3 * 4096})
	data := testfiles.RandomBytes(5*4096+123, 1)
	r, err := d.Alloc(int64(len(data)))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Free()
	if got := r.Chunks(); len(got) != 2 || got[0] != 3*4096 || got[1] != 3*4096 {
		t.Fatalf("chunks %v, want two of 3 pages", got)
	}
	fill(t, d, r, data)
	got := make([]byte, len(data))
	if _, err := r.ReadAt(got, 0); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read back differs (err %v)", err)
	}
	if err := r.Seal(); err != nil {
		t.Fatal(err)
	}

	files, err := r.Export()
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	m, err := chunkmap.Host(files, r.Chunks(), r.Size(), false)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if !bytes.Equal(m.Bytes(), data) {
		t.Fatal("consumer mapping differs from the data")
	}

	// Sealed: neither the daemon nor a consumer can write.
	if err := r.(*Region).writeAt([]byte{1}, 0); err == nil {
		t.Fatal("write into a sealed region succeeded")
	}
	_, err = unix.Mmap(int(files[0].Fd()), 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if !errors.Is(err, unix.EPERM) {
		t.Fatalf("writable shared mapping of a sealed chunk: %v, want EPERM", err)
	}
	if _, err := unix.Pwrite(int(files[0].Fd()), []byte{1}, 0); !errors.Is(err, unix.EPERM) {
		t.Fatalf("pwrite into a sealed chunk: %v, want EPERM", err)
	}
	if err := unix.Mprotect(m.Bytes()[:4096], unix.PROT_READ|unix.PROT_WRITE); err == nil {
		t.Fatal("consumer made its mapping of a sealed chunk writable")
	}
}

func TestCopyAndBounds(t *testing.T) {
	d := Open(gpu.Options{ChunkSize: 1 << 20})
	data := testfiles.RandomBytes(10000, 2)
	src, _ := d.Alloc(int64(len(data)))
	dst, _ := d.Alloc(int64(len(data)))
	small, _ := d.Alloc(10)
	defer src.Free()
	defer dst.Free()
	defer small.Free()
	fill(t, d, src, data)
	if err := d.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(data))
	if _, err := dst.ReadAt(got, 0); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("copy differs (%v)", err)
	}
	if err := d.Copy(small, src); err == nil {
		t.Fatal("copy into a smaller region accepted")
	}
	w, _ := d.NewWorker(100)
	if err := w.CopyAsync(small, 5, 0, 100); err != nil {
		t.Fatal(err)
	}
	if err := w.Wait(0); err == nil {
		t.Fatal("copy past the region's end reported no error")
	}
	if _, err := src.ReadAt(make([]byte, 10), 9995); err == nil {
		t.Fatal("read past the end reported no error")
	}
}

func TestMemInfo(t *testing.T) {
	free, total, err := Open(gpu.Options{}).MemInfo()
	if err != nil || total <= 0 || free <= 0 || free > total {
		t.Fatalf("MemInfo = %d, %d, %v", free, total, err)
	}
}

// Several host devices: named host0 .. hostN-1 with their ordinals, peers
// of each other, their "peer copy" a memcpy between regions.
func TestHostDevicesPeerCopy(t *testing.T) {
	if one := OpenN(gpu.Options{ChunkSize: 1 << 16}, 1); len(one) != 1 || one[0].Name() != "host" || one[0].Ordinal() != -1 {
		t.Fatalf("one host device: %v %q %d", len(one), one[0].Name(), one[0].Ordinal())
	}
	devs := OpenN(gpu.Options{ChunkSize: 1 << 16}, 3)
	for i, d := range devs {
		if want := "host" + string(rune('0'+i)); d.Name() != want || d.Ordinal() != i {
			t.Errorf("device %d: %q ordinal %d", i, d.Name(), d.Ordinal())
		}
	}
	a, b := devs[0], devs[2]
	if ok, why := b.PeerAccess(a); !ok {
		t.Fatalf("host devices are not peers: %s", why)
	}
	const size = 300000
	data := testfiles.RandomBytes(size, 9)
	src, err := a.Alloc(size)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Free()
	fill(t, a, src, data)
	dst, err := b.Alloc(size)
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Free()
	for _, sp := range [][2]int64{{0, 131072}, {131072, size}} {
		if err := b.CopyRange(dst, sp[0], src, sp[0], sp[1]-sp[0]); err != nil {
			t.Fatal(err)
		}
	}
	got := make([]byte, size)
	if _, err := dst.ReadAt(got, 0); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("copy differs (%v)", err)
	}
	if err := b.CopyRange(dst, 0, src, 1, size); err == nil {
		t.Error("a copy past the source's end succeeded")
	}
	if err := dst.Seal(); err != nil {
		t.Fatal(err)
	}
	if err := b.CopyRange(dst, 0, src, 0, 10); err == nil {
		t.Error("a copy into a sealed region succeeded")
	}
}

// TestImport: a sealed region's exported memfds make a region of the
// same bytes, which outlives the exporter's Free; what is not a complete
// region is refused.
func TestImport(t *testing.T) {
	d := Open(gpu.Options{ChunkSize: 3 * 4096})
	data := testfiles.RandomBytes(5*4096+123, 2)
	r, err := d.Alloc(int64(len(data)))
	if err != nil {
		t.Fatal(err)
	}
	fill(t, d, r, data)
	unsealed, err := r.Export()
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll(unsealed)
	if _, err := d.Import(unsealed, r.Chunks(), r.Size()); err == nil {
		t.Fatal("Import of an unsealed region succeeded")
	}
	if err := r.Seal(); err != nil {
		t.Fatal(err)
	}
	files, err := r.Export()
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll(files)
	for name, tc := range map[string]struct {
		chunks []int64
		size   int64
		files  []*os.File
	}{
		"one descriptor short": {r.Chunks(), r.Size(), files[:1]},
		"other lengths":        {[]int64{2 * 4096, 4 * 4096}, r.Size(), files},
		"too small":            {r.Chunks(), 7 * 4096, files},
		"a chunk too many":     {r.Chunks(), 2 * 4096, files},
	} {
		if _, err := d.Import(tc.files, tc.chunks, tc.size); err == nil {
			t.Errorf("%s: Import succeeded", name)
		}
	}
	im, err := d.Import(files, r.Chunks(), r.Size())
	if err != nil {
		t.Fatal(err)
	}
	defer im.Free()
	closeAll(files) // the region holds its own
	if err := r.Free(); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(data))
	if _, err := im.ReadAt(got, 0); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("imported bytes differ (%v)", err)
	}
	if err := im.Seal(); err != nil {
		t.Fatalf("Seal of an imported region: %v", err)
	}
	if err := im.(*Region).writeAt([]byte{1}, 0); err == nil {
		t.Fatal("an imported region took a write")
	}
}

func closeAll(fs []*os.File) {
	for _, f := range fs {
		f.Close()
	}
}
