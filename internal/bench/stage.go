package bench

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/gdsfs/gdsfs/gpu"
	"github.com/gdsfs/gdsfs/internal/config"
	"github.com/gdsfs/gdsfs/internal/devices"
	"github.com/gdsfs/gdsfs/internal/units"
	"github.com/gdsfs/gdsfs/staging"
)

// StageOptions are the flags of `gdsfs bench stage`.
type StageOptions struct {
	File  string     // file to stage; "" makes one of Size in Dir
	Size  units.Size // of the file made
	Dir   string     // where the file is made (a disk filesystem)
	Runs  int        // runs per measurement; the best is reported
	Cold  bool       // also measure with the page cache dropped (root)
	Peers bool       // also measure the Python peers
	JSON  bool       // print JSON
}

// StageDoc is the long help of `gdsfs bench stage`.
const StageDoc = `Stages one file through each load path of the configured device (POSIX and
cuFile), with the page cache warm and, with --cold, dropped before every run
(root). In the same run it measures the baselines: the pinned host-to-device
copy rate, the disk's O_DIRECT read rate (16 MiB reads), and with --peers the
Python peers (a plain read then .cuda(), torch.from_file, pinned readinto,
torch.cuda.gds), then checks the targets. --set takes config.yaml keys
(io.num_threads=16, staging.device=host, ...).`

// Validate checks the options.
func (o StageOptions) Validate() error {
	if o.Runs < 1 {
		return fmt.Errorf("--runs %d: want at least 1", o.Runs)
	}
	if o.Cold && os.Geteuid() != 0 {
		return errors.New("--cold drops the page cache: run as root")
	}
	return nil
}

// StageConfig is the configuration `gdsfs bench stage` stages with: the
// defaults, prefetch off, then sets.
func StageConfig(sets []string) (*config.Config, error) {
	return config.Load("", append([]string{"staging.prefetch=manual"}, sets...))
}

// benchRow is one line of a benchmark table: GB/s warm and cold (0: not
// measured), or why it could not be measured.
type benchRow struct {
	Name   string  `json:"name"`
	Warm   float64 `json:"warm_gbps,omitempty"`
	Cold   float64 `json:"cold_gbps,omitempty"`
	Why    string  `json:"unavailable,omitempty"`
	Kind   string  `json:"kind"` // baseline, gdsfs or peer
	Detail string  `json:"detail,omitempty"`
}

type stageBench struct {
	o    StageOptions
	cfg  *config.Config
	dev  gpu.Device
	path string
	size int64
	rows []benchRow
}

// Stage runs `gdsfs bench stage` with cfg (StageConfig) and prints the
// table or JSON to stdout.
func Stage(cfg *config.Config, o StageOptions) error {
	devs, err := devices.Open(cfg.Staging, zap.NewNop())
	if err != nil {
		return err
	}
	defer devices.Close(devs)
	b := &stageBench{o: o, cfg: cfg, dev: devs[0]}
	if b.path, b.size, err = benchFile(o); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "staging %s (%s) on %s\n", b.path, units.HumanBytes(b.size), b.dev.Name())
	b.rows = append(b.rows, b.copyBaseline(), b.diskBaseline())
	for _, compat := range []string{staging.CompatOn, staging.CompatOff} {
		b.rows = append(b.rows, b.stagePath(compat))
	}
	if o.Peers {
		b.rows = append(b.rows, runPeers(b.path, b.dev, o)...)
	}
	return printStageBench(b, o.JSON)
}

// benchFile returns the file to stage, making it if needed.
func benchFile(o StageOptions) (string, int64, error) {
	if o.File != "" {
		st, err := os.Stat(o.File)
		if err != nil {
			return "", 0, err
		}
		return o.File, st.Size(), nil
	}
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return "", 0, err
	}
	p := filepath.Join(o.Dir, fmt.Sprintf("bench-%d.bin", int64(o.Size)))
	if st, err := os.Stat(p); err == nil && st.Size() == int64(o.Size) {
		return p, st.Size(), nil
	}
	f, err := os.Create(p)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	if _, err := io.CopyN(f, rand.Reader, int64(o.Size)); err != nil {
		return "", 0, fmt.Errorf("write %s: %w", p, err)
	}
	return p, int64(o.Size), f.Sync()
}

func gbps(n int64, d time.Duration) float64 { return float64(n) / d.Seconds() / 1e9 }

// copyBaseline is the pinned host-to-device copy rate: 512 MiB buffers,
// 4 GiB copied through both in turn.
func (b *stageBench) copyBaseline() benchRow {
	row := benchRow{Name: "pinned host-to-device copy", Kind: "baseline"}
	const buf, total = 512 << 20, 4 << 30
	r, err := b.dev.Alloc(total)
	if err != nil {
		row.Why = err.Error()
		return row
	}
	defer r.Free()
	w, err := b.dev.NewWorker(buf)
	if err != nil {
		row.Why = err.Error()
		return row
	}
	defer w.Close()
	for range b.o.Runs {
		start := time.Now()
		var err error
		for k := 0; k < total/buf && err == nil; k++ {
			if err = w.Wait(k & 1); err == nil {
				err = w.CopyAsync(r, int64(k)*buf, k&1, buf)
			}
		}
		if err = errors.Join(err, w.Wait(0), w.Wait(1)); err != nil {
			row.Why = err.Error()
			return row
		}
		row.Warm = max(row.Warm, gbps(total, time.Since(start)))
	}
	return row
}

// diskBaseline reads the file with O_DIRECT in 16 MiB requests, one stream,
// as `dd iflag=direct bs=16M` does.
func (b *stageBench) diskBaseline() benchRow {
	row := benchRow{Name: "disk O_DIRECT read, 16 MiB", Kind: "baseline"}
	f, err := os.OpenFile(b.path, os.O_RDONLY|syscall.O_DIRECT, 0)
	if err != nil {
		row.Why = err.Error()
		return row
	}
	defer f.Close()
	buf, err := syscall.Mmap(-1, 0, 16<<20, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANONYMOUS)
	if err != nil {
		row.Why = err.Error()
		return row
	}
	defer syscall.Munmap(buf)
	for range b.o.Runs {
		start := time.Now()
		var n int64
		for {
			k, err := f.ReadAt(buf, n)
			n += int64(k)
			if err != nil {
				break
			}
		}
		row.Cold = max(row.Cold, gbps(n, time.Since(start)))
	}
	return row
}

// stagePath stages the file with io.compat_mode=compat, warm and cold.
func (b *stageBench) stagePath(compat string) benchRow {
	io := b.cfg.IO
	io.CompatMode = compat
	c, err := staging.New(context.Background(), staging.Config{
		Source: filepath.Dir(b.path), Options: b.cfg.Staging, IO: io, Devices: []gpu.Device{b.dev},
	})
	name := map[string]string{staging.CompatOn: "gdsfs POSIX path", staging.CompatOff: "gdsfs cuFile path"}[compat]
	row := benchRow{Name: name, Kind: "gdsfs"}
	if err != nil {
		row.Why = err.Error()
		return row
	}
	defer c.Close()
	rel := filepath.Base(b.path)
	time.Sleep(100 * time.Millisecond) // workers allocate their buffers before the clock starts
	measure := func(cold bool) float64 {
		best := 0.0
		for range b.o.Runs {
			if cold {
				dropCaches()
			} else {
				readAll(b.path)
			}
			start := time.Now()
			info, err := c.Stage(context.Background(), rel)
			took := time.Since(start)
			if err != nil {
				row.Why = err.Error()
				return 0
			}
			row.Detail = info.LoadPath + " path, " + info.Device
			best = max(best, gbps(b.size, took))
			c.Evict(rel)
		}
		return best
	}
	row.Warm = measure(false)
	if b.o.Cold && row.Why == "" {
		row.Cold = measure(true)
	}
	return row
}

func dropCaches() {
	syscall.Sync()
	os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0)
}

func readAll(path string) {
	f, err := os.Open(path)
	if err != nil {
		return
	}
	defer f.Close()
	io.Copy(io.Discard, f)
}
