package chunkmap

import (
	"bytes"
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/proto"
)

// memfd returns a memfd holding data.
func memfd(t *testing.T, data []byte) *os.File {
	t.Helper()
	fd, err := unix.MemfdCreate("chunk", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "memfd")
	t.Cleanup(func() { f.Close() })
	if _, err := f.Write(data); err != nil {
		t.Fatal(err)
	}
	return f
}

func TestHostMapsChunksBackToBack(t *testing.T) {
	page := os.Getpagesize()
	a, b := bytes.Repeat([]byte{1}, page), bytes.Repeat([]byte{2}, page)
	files := []*os.File{memfd(t, a), memfd(t, b)}
	size := int64(2*page - 10)
	m, err := Map(proto.DeviceHost, files, []int64{int64(page), int64(page)}, size, false)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	want := append(append([]byte(nil), a...), b...)[:size]
	got := make([]byte, size+5)
	if n, err := m.ReadAt(got, 0); n != int(size) || err == nil {
		t.Fatalf("ReadAt past the end = %d, %v; want %d, EOF", n, err, size)
	}
	if !bytes.Equal(got[:size], want) || !bytes.Equal(m.(*HostMapping).Bytes(), want) {
		t.Fatal("mapped bytes differ from the chunks")
	}
	if !m.ReadOnly() {
		t.Error("a shared mapping says it is writable")
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

func TestMapRejectsBadInput(t *testing.T) {
	f := memfd(t, make([]byte, 100))
	for _, tc := range []struct {
		name  string
		files []*os.File
		lens  []int64
		size  int64
	}{
		{"no chunks", nil, nil, 0},
		{"fewer lengths than descriptors", []*os.File{f}, nil, 0},
		{"empty chunk", []*os.File{f}, []int64{0}, 0},
		{"no descriptor", []*os.File{nil}, []int64{4096}, 0},
		{"size past the chunks", []*os.File{f}, []int64{4096}, 4097},
		{"negative size", []*os.File{f}, []int64{4096}, -1},
	} {
		for _, device := range []string{proto.DeviceHost, "GPU-00000000-0000-0000-0000-000000000000"} {
			if m, err := Map(device, tc.files, tc.lens, tc.size, false); err == nil {
				m.Close()
				t.Errorf("%s on %q: Map succeeded", tc.name, device)
			}
		}
	}
	if m, err := Host([]*os.File{f}, []int64{1 << 30}, 100, false); err == nil {
		m.Close()
		t.Error("Host mapped a chunk longer than its descriptor")
	}
}
