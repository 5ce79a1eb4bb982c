package loader

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gdsfs/gdsfs/gpu"
	"github.com/gdsfs/gdsfs/gpu/host"
)

// newHostLoader starts a loader of two workers onto a host device; it is
// closed with the test.
func newHostLoader(t *testing.T) (*Loader, gpu.Device) {
	t.Helper()
	dev := host.Open(gpu.Options{ChunkSize: 1 << 20})
	l := New(context.Background(), dev, Options{
		NumThreads: 2, BounceSize: 4096, TaskSize: 16384, CompatMode: CompatAuto, DirectIO: DirectOff,
	}, Hooks{})
	t.Cleanup(l.Close)
	return l, dev
}

// tempFile writes data to a new file and opens it.
func tempFile(t *testing.T, data []byte) *os.File {
	t.Helper()
	p := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func noDirect() (*os.File, error) { return nil, errors.New("not wanted here") }

// TestLoadWithoutCache: a request (a descriptor, a size, a span, a
// region) is all a load needs; the result names the path and why it is
// not cuFile. A span loads only its bytes.
func TestLoadWithoutCache(t *testing.T) {
	l, dev := newHostLoader(t)
	data := make([]byte, 5*16384+123)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	f := tempFile(t, data)
	size := int64(len(data))
	for _, sp := range []Span{{0, size}, {16384, 3 * 16384}} {
		r, err := dev.Alloc(size)
		if err != nil {
			t.Fatal(err)
		}
		res, err := l.Load(Request{Rel: "f", File: f, Size: size, Span: sp, Region: r, OpenDirect: noDirect})
		if err != nil {
			t.Fatalf("span %v: %v", sp, err)
		}
		if res.Path != PathHost || !strings.Contains(res.Note, "cuFile unavailable") || res.CuFileFallback {
			t.Fatalf("span %v: result %+v, want the host path, cuFile unavailable, no fallback counted", sp, res)
		}
		got := make([]byte, size)
		if _, err := r.ReadAt(got, 0); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got[sp.Off:sp.End], data[sp.Off:sp.End]) {
			t.Fatalf("span %v: bytes differ", sp)
		}
		if sp.Off > 0 && !bytes.Equal(got[:sp.Off], make([]byte, sp.Off)) {
			t.Fatalf("span %v: bytes before the span were written", sp)
		}
		r.Free()
	}
}

// TestLoadOfAShrunkFile: a file shorter than the request says ends the
// load with ErrChanged.
func TestLoadOfAShrunkFile(t *testing.T) {
	l, dev := newHostLoader(t)
	f := tempFile(t, make([]byte, 20000))
	r, err := dev.Alloc(40000)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Free()
	_, err = l.Load(Request{Rel: "f", File: f, Size: 40000, Span: Span{0, 40000}, Region: r, OpenDirect: noDirect})
	if !errors.Is(err, ErrChanged) || !strings.Contains(err.Error(), "it shrank") {
		t.Fatalf("err %v, want ErrChanged: it shrank", err)
	}
}
