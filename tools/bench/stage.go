package bench

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/gdsfs/gdsfs/daemon/config"
	"github.com/gdsfs/gdsfs/gpu"
	"github.com/gdsfs/gdsfs/internal/devices"
	"github.com/gdsfs/gdsfs/internal/units"
	"github.com/gdsfs/gdsfs/staging"
)

// StageOptions are the flags of `gdsfs bench stage`.
type StageOptions struct {
	File   string     // file to stage; "" makes one of Size in Dir
	Size   units.Size // of the file made
	Dir    string     // where the file is made (a disk filesystem)
	Runs   int        // runs per measurement; the best is reported
	Rounds int        // rounds interleaving the H2D copy, gdsfs's defaults and the KvikIO sweep
	Cold   bool       // also measure with the page cache dropped (root)
	Peers  bool       // also measure the Python peers
	Quick  bool       // skip the explicit POSIX row, the Python peers and (without Cold) the disk baselines
	JSON   bool       // print JSON
	Report string     // append the JSON result to this file
	Kvik   KvikOptions
}

//go:embed stage.md
var stageHelp string

// StageDoc is the long help of `gdsfs bench stage`: stage.md and the exit-status rule.
var StageDoc = stageHelp + "\n" + VerdictRule

// Validate checks the options.
func (o StageOptions) Validate() error {
	switch {
	case o.Runs < 1:
		return fmt.Errorf("--runs %d: want at least 1", o.Runs)
	case o.Rounds < 1:
		return fmt.Errorf("--rounds %d: want at least 1", o.Rounds)
	case o.Cold && os.Geteuid() != 0:
		return errors.New("--cold drops the page cache: run as root")
	}
	if o.Kvik.Bin != "" {
		if !isExecutable(o.Kvik.Bin) {
			return fmt.Errorf("--kvikio %s: not an executable file", o.Kvik.Bin)
		}
		if len(o.Kvik.Threads) == 0 || len(o.Kvik.Tasks) == 0 || o.Kvik.Runs < 1 {
			return errors.New("--kvikio-threads, --kvikio-tasks and --kvikio-runs: want at least one value each")
		}
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
	Name   string    `json:"name"`
	Warm   float64   `json:"warm_gbps,omitempty"`
	Cold   float64   `json:"cold_gbps,omitempty"`
	Rounds []float64 `json:"rounds_gbps,omitempty"` // warm, best of each round
	Why    string    `json:"unavailable,omitempty"`
	Kind   string    `json:"kind"` // baseline, gdsfs, defaults or peer
	Detail string    `json:"detail,omitempty"`
}

const (
	rowH2D          = "pinned host-to-device copy"
	rowDisk         = "disk O_DIRECT read, 16 MiB"
	rowDiskBuffered = "disk buffered read, 16 MiB, cache dropped"
)

type stageBench struct {
	o    StageOptions
	cfg  *config.Config
	dev  gpu.Device
	path string
	size int64
	rows []benchRow
	kvik *kvikSweep
	// hostChosen: staging.device=host, so GPU-only rows and targets are
	// not measured here (else, on the host backend, they fail).
	hostChosen bool
}

// Stage runs `gdsfs bench stage` with cfg (StageConfig) and prints the
// table or JSON to stdout. Its error is the verdict (VerdictRule) when
// all was printed.
func Stage(ctx context.Context, cfg *config.Config, o StageOptions) error {
	if o.File == "" {
		if err := openWorkDir("--dir", o.Dir); err != nil {
			return err
		}
	}
	devs, err := devices.Open(cfg.Staging, zap.NewNop())
	if err != nil {
		return err
	}
	defer devices.Close(devs)
	b := &stageBench{o: o, cfg: cfg, dev: devs[0], hostChosen: cfg.Staging.Device == staging.DeviceHost}
	if b.path, b.size, err = benchFile(o); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "staging %s (%s) on %s, %d round(s)\n", b.path, units.HumanBytes(b.size), b.dev.Name(), o.Rounds)
	b.interleaved(ctx)
	if !o.Quick || o.Cold {
		b.rows = append(b.rows, b.diskBaseline(rowDisk, syscall.O_DIRECT), b.diskBaseline(rowDiskBuffered, 0))
	}
	if !o.Quick {
		b.rows = append(b.rows, b.once(staging.CompatOn, "gdsfs POSIX path", "gdsfs"))
	}
	if b.hostChosen {
		b.rows = append(b.rows, benchRow{Name: "gdsfs cuFile path", Kind: "gdsfs", Why: statusNotHere + whyHost})
	} else {
		b.rows = append(b.rows, b.once(staging.CompatOff, "gdsfs cuFile path", "gdsfs"))
	}
	if o.Peers && !o.Quick {
		b.rows = append(b.rows, runPeers(b.path, b.dev, o, b.hostChosen)...)
	}
	return b.print()
}

// interleaved runs the rounds: the pinned copy, gdsfs's defaults, then the
// KvikIO sweep, in turn.
func (b *stageBench) interleaved(ctx context.Context) {
	h2d := benchRow{Name: rowH2D, Kind: "baseline"}
	if b.dev.Kind() != gpu.KindCUDA {
		h2d.Name, h2d.Detail = "host memcpy (in place of the H2D copy)", "host backend"
	}
	def := benchRow{Name: "gdsfs defaults", Kind: "defaults", Detail: ioSettings(b.cfg)}
	s := b.newStager("")
	defer s.close()
	switch {
	case b.o.Kvik.Bin != "" && b.dev.Kind() == gpu.KindCUDA:
		b.kvik = &kvikSweep{o: b.o.Kvik, file: b.path}
	case b.o.Kvik.Bin != "":
		defer func() {
			why := "KvikIO reads into GPU memory; " + whyNoGPU
			if b.hostChosen {
				why = statusNotHere + whyHost
			}
			b.rows = append(b.rows, benchRow{Name: "KvikIO compat sweep", Kind: "kvikio", Why: why})
		}()
	}
	for r := range b.o.Rounds {
		if h2d.Why == "" {
			v, err := b.copyBaseline()
			h2d.add(v, err)
		}
		if s.err == nil {
			v, err := s.measure(b, false)
			def.add(v, err)
		}
		if b.kvik != nil {
			b.kvik.round(ctx, r)
		}
		if ctx.Err() != nil {
			break
		}
	}
	if s.err != nil {
		def.Why = s.err.Error()
	} else {
		def.Detail = s.detail + "; " + def.Detail
		if b.o.Cold {
			var err error
			if def.Cold, err = s.measure(b, true); err != nil {
				def.Why = "cold: " + err.Error()
			}
		}
	}
	b.rows = append(b.rows, h2d, def)
}

func (r *benchRow) add(v float64, err error) {
	if err != nil {
		r.Why = err.Error()
		return
	}
	r.Rounds = append(r.Rounds, v)
	r.Warm = max(r.Warm, v)
}

// once is one row staged with compat mode compat, warm and (--cold) cold.
func (b *stageBench) once(compat, name, kind string) benchRow {
	row := benchRow{Name: name, Kind: kind}
	s := b.newStager(compat)
	defer s.close()
	if s.err != nil {
		row.Why = s.err.Error()
		return row
	}
	var err error
	if row.Warm, err = s.measure(b, false); err == nil && b.o.Cold {
		row.Cold, err = s.measure(b, true)
	}
	if err != nil {
		row.Why = err.Error()
	}
	row.Detail = s.detail
	return row
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
	p := filepath.Join(o.Dir, fmt.Sprintf("bench-%d.bin", int64(o.Size)))
	_, err := makeFile(p, int64(o.Size), false)
	return p, int64(o.Size), err
}

func gbps(n int64, d time.Duration) float64 { return float64(n) / d.Seconds() / 1e9 }

// copyBaseline is the pinned host-to-device copy rate, the best of Runs:
// 512 MiB buffers, 4 GiB (less for a file under 4 GiB, at least 1 GiB)
// copied through both in turn.
func (b *stageBench) copyBaseline() (float64, error) {
	const buf = 512 << 20
	total := int64(4 << 30)
	if b.size < total {
		total = max(1<<30, gpu.RoundUp(b.size, buf))
	}
	r, err := b.dev.Alloc(total)
	if err != nil {
		return 0, err
	}
	defer r.Free()
	w, err := b.dev.NewWorker(buf)
	if err != nil {
		return 0, err
	}
	defer w.Close()
	best := 0.0
	for range b.o.Runs {
		start := time.Now()
		var err error
		for k := 0; k < int(total/buf) && err == nil; k++ {
			if err = w.Wait(k & 1); err == nil {
				err = w.CopyAsync(r, int64(k)*buf, k&1, buf)
			}
		}
		if err = errors.Join(err, w.Wait(0), w.Wait(1)); err != nil {
			return 0, err
		}
		best = max(best, gbps(total, time.Since(start)))
	}
	return best, nil
}

// diskBaseline reads the file in 16 MiB requests, one stream, as `dd
// bs=16M` does: with flags O_DIRECT as `dd iflag=direct`, else buffered
// with the page cache dropped before each run (where it can be dropped:
// without --cold, a buffered figure would be the page cache's, so the row
// says it was not measured).
func (b *stageBench) diskBaseline(name string, flags int) benchRow {
	row := benchRow{Name: name, Kind: "baseline"}
	if flags&syscall.O_DIRECT == 0 && !b.o.Cold {
		row.Why = statusNotHere + "a buffered disk read needs the page cache dropped (--cold)"
		return row
	}
	buf, err := syscall.Mmap(-1, 0, 16<<20, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANONYMOUS)
	if err != nil {
		row.Why = err.Error()
		return row
	}
	defer syscall.Munmap(buf)
	for range b.o.Runs {
		if flags&syscall.O_DIRECT == 0 {
			if err := dropCaches(); err != nil {
				row.Why = err.Error()
				return row
			}
		}
		v, err := readAll(b.path, flags, buf)
		if err != nil {
			row.Why = err.Error()
			return row
		}
		row.Cold = max(row.Cold, v)
	}
	return row
}

// readAll reads path whole through buf, opened with flags, and returns GB/s.
func readAll(path string, flags int, buf []byte) (float64, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|flags, 0)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	start := time.Now()
	var n int64
	for {
		k, err := f.ReadAt(buf, n)
		n += int64(k)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return 0, fmt.Errorf("read %s: %w", path, err)
		}
	}
	return gbps(n, time.Since(start)), nil
}

// stager is a staging cache over the file's directory, made once and
// measured in every round, so start-up work (tuning, buffers) is paid once.
type stager struct {
	c      *staging.Cache
	rel    string
	detail string // load path and device of the last stage
	err    error  // the cache could not be made or the file staged
}

// newStager makes the cache with io.compat_mode=compat ("" keeps the
// configured mode) and stages the file once, untimed: workers have their
// buffers and the page cache holds the file before the clock starts.
func (b *stageBench) newStager(compat string) *stager {
	io := b.cfg.IO
	if compat != "" {
		io.CompatMode = compat
	}
	s := &stager{rel: filepath.Base(b.path)}
	s.c, s.err = staging.New(context.Background(), staging.Config{
		Source: filepath.Dir(b.path), Options: b.cfg.Staging, IO: io, Devices: []gpu.Device{b.dev},
	})
	if s.err == nil {
		_, s.err = s.stageOnce()
	}
	return s
}

func (s *stager) stageOnce() (time.Duration, error) {
	start := time.Now()
	info, err := s.c.Stage(context.Background(), s.rel)
	took := time.Since(start)
	if err != nil {
		return 0, err
	}
	s.detail = info.LoadPath + " path, " + info.Device
	return took, s.c.Evict(s.rel)
}

// measure is the best of Runs stagings, page cache warm or dropped.
func (s *stager) measure(b *stageBench, cold bool) (float64, error) {
	best := 0.0
	if !cold {
		if err := warmPageCache(b.path); err != nil {
			return 0, err
		}
	}
	for range b.o.Runs {
		if cold {
			if err := dropCaches(); err != nil {
				return 0, err
			}
		}
		took, err := s.stageOnce()
		if err != nil {
			return 0, err
		}
		best = max(best, gbps(b.size, took))
	}
	return best, nil
}

func (s *stager) close() {
	if s.c != nil {
		s.c.Close()
	}
}

// dropCaches drops the page cache; a cold figure without it is not cold.
func dropCaches() error {
	syscall.Sync()
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0); err != nil {
		return fmt.Errorf("drop the page cache: %w", err)
	}
	return nil
}
