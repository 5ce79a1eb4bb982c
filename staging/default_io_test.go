package staging_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/gdsfs/gdsfs/daemon/config"
	"github.com/gdsfs/gdsfs/gpu"
	"github.com/gdsfs/gdsfs/gpu/host"
	"github.com/gdsfs/gdsfs/staging"
	"github.com/gdsfs/gdsfs/staging/loader"
)

// TestDefaultStagesColdFilesBuffered: a file out of the page cache is
// staged with buffered reads under the embedded defaults, the read path a
// plain reader of the file gets, so `load_file` under `gdsfs run` of a
// file not yet staged is never slower than the plain call because of
// O_DIRECT (a disk may serve O_DIRECT slower than buffered reads).
func TestDefaultStagesColdFilesBuffered(t *testing.T) {
	cfg, err := config.Load("", nil)
	if err != nil {
		t.Fatal(err)
	}
	src := t.TempDir()
	data := staging.RandomBytes(8<<20+12345, 14)
	path := filepath.Join(src, "cold.bin")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	staging.DropCache(t, path, int64(len(data)))
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
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if share := loader.ResidentShare(f, int64(len(data))); share < 0.9 {
		t.Fatalf("after staging only %.0f%% of the file is in the page cache: it was not read buffered (note %q)", share*100, info.Note)
	}
	staging.CheckStaged(t, c, "cold.bin", data)
}
