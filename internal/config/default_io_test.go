package config

import (
	"bytes"
	"context"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unsafe"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/gpu"
	"github.com/gdsfs/gdsfs/gpu/host"
	"github.com/gdsfs/gdsfs/staging"
)

// TestDefaultStagesColdFilesBuffered (issue 14, measured on the H200): a
// file out of the page cache is staged with buffered reads under the
// embedded defaults, the read path a plain reader of the file gets. With
// the former default (io.direct_io: auto) it was read with O_DIRECT, which
// that machine's disk served at 1.1 GB/s against 1.5-1.7 buffered, so
// `load_file` under `gdsfs run` of a file not yet staged was slower than
// the plain call (0.88x) where it must not be.
func TestDefaultStagesColdFilesBuffered(t *testing.T) {
	cfg, err := Load("", nil)
	if err != nil {
		t.Fatal(err)
	}
	src := t.TempDir()
	data := make([]byte, 8<<20+12345)
	r := rand.New(rand.NewPCG(14, 8))
	for i := range data {
		data[i] = byte(r.Uint32())
	}
	path := filepath.Join(src, "cold.bin")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if share := dropFromPageCache(t, path); share > 0.1 {
		t.Fatalf("TMPDIR's filesystem keeps the file in the page cache (%.0f%% after FADV_DONTNEED): this test needs a disk filesystem", share*100)
	}
	opts := cfg.Staging
	opts.Device, opts.Prefetch = staging.DeviceHost, staging.PrefetchManual
	c, err := staging.New(context.Background(), staging.Config{
		Source: src, Options: opts, IO: cfg.IO,
		Devices: []gpu.Device{host.Open(gpu.Options{ChunkSize: int64(opts.ChunkSize)})},
		Log:     zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	info, err := c.Stage(context.Background(), "cold.bin")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(info.Note, "O_DIRECT") {
		t.Fatalf("the defaults (io.direct_io: %s) staged a file out of the page cache with O_DIRECT: %q", cfg.IO.DirectIO, info.Note)
	}
	if share := residentShare(t, path); share < 0.9 {
		t.Fatalf("after staging only %.0f%% of the file is in the page cache: it was not read buffered (note %q)", share*100, info.Note)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	l, err := c.Acquire(ctx, staging.Request{Rel: "cold.bin"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	got := make([]byte, l.Size())
	if _, err := l.Region().ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("the staged bytes differ from the file's")
	}
}

// dropFromPageCache writes path back, drops it from the page cache and
// returns the share of it still there.
func dropFromPageCache(t *testing.T, path string) float64 {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		t.Fatal(err)
	}
	return residentShare(t, path)
}

// residentShare is the share of path's pages in the page cache (mincore).
func residentShare(t *testing.T, path string) float64 {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	m, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(m)
	page := os.Getpagesize()
	vec := make([]byte, (len(m)+page-1)/page)
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		t.Fatal(errno)
	}
	in := 0
	for _, v := range vec {
		in += int(v & 1)
	}
	return float64(in) / float64(len(vec))
}
