package bench

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/gdsfs/gdsfs/daemon/config"
	"github.com/gdsfs/gdsfs/gpu"
	"github.com/gdsfs/gdsfs/internal/devices"
	"github.com/gdsfs/gdsfs/internal/units"
	"github.com/gdsfs/gdsfs/staging"
)

// MultiGPUOptions are the flags of `gdsfs bench multigpu`.
type MultiGPUOptions struct {
	Size      units.Size // of each of the two files
	Dir       string     // where the files are made (memory or a disk with room in the page cache)
	Work      string     // the mount, its socket and log, the helpers
	Runs      int        // runs per measurement; the shortest is reported
	Consumers bool       // also mount and run the consumers (root)
	Py        PyFlags
	Sets      []string
	JSON      bool
	Report    string
}

//go:embed multigpu.md
var multiGPUHelp string

// MultiGPUDoc is the long help of `gdsfs bench multigpu`: multigpu.md and the exit-status rule.
var MultiGPUDoc = multiGPUHelp + "\n" + VerdictRule

// Validate checks the options.
func (o MultiGPUOptions) Validate() error {
	switch {
	case o.Runs < 1:
		return fmt.Errorf("--runs %d: want at least 1", o.Runs)
	case o.Size < 1<<20:
		return fmt.Errorf("--size %s: want at least 1MiB", o.Size)
	case o.Consumers && os.Geteuid() != 0:
		return errors.New("the consumers mount DIR: run as root, or --consumers=false")
	}
	return nil
}

// MultiGPUConfig is the configuration of `gdsfs bench multigpu`: the
// defaults, prefetch off, staging.gpus [0,1], then sets.
func MultiGPUConfig(sets []string) (*config.Config, error) {
	return config.Load("", multiGPUSets(sets))
}

func multiGPUSets(sets []string) []string {
	return append([]string{"staging.prefetch=manual", "staging.gpus=[0,1]"}, sets...)
}

// multiGPUResult is the JSON of `gdsfs bench multigpu`.
type multiGPUResult struct {
	Kind      string      `json:"kind"` // cuda or host
	Devices   []string    `json:"devices"`
	FileBytes int64       `json:"file_bytes"`
	Baselines []mgRow     `json:"baselines"`
	Stagings  []mgRow     `json:"stagings"`
	Consumers []mgVerdict `json:"consumers"`
	Checks    []Check     `json:"checks"`
	// HostChosen: staging.device=host (the targets are not measured here).
	HostChosen bool `json:"staging_device_host"`
}

// mgVerdict is one consumer check: passed or not, with what was seen.
type mgVerdict struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail"`
}

func (v mgVerdict) String() string {
	s := "FAIL"
	if v.OK {
		s = "PASS"
	}
	return fmt.Sprintf("consumer  %s  %s: %s", s, v.Name, v.Detail)
}

// MultiGPU runs `gdsfs bench multigpu` with cfg (MultiGPUConfig).
func MultiGPU(ctx context.Context, cfg *config.Config, o MultiGPUOptions) error {
	if err := openWorkDir("--dir", o.Dir); err != nil {
		return err
	}
	if err := openWorkDir("--work", o.Work); err != nil {
		return err
	}
	devs, err := devices.Open(cfg.Staging, zap.NewNop())
	if err != nil {
		return err
	}
	if len(devs) < 2 {
		devices.Close(devs)
		return fmt.Errorf("bench multigpu needs two devices, staging opened %d (staging.gpus=[0,1]; no GPU: staging.device=host with staging.host_devices=2)", len(devs))
	}
	devs = devs[:2]
	res := &multiGPUResult{Kind: devs[0].Kind(), FileBytes: int64(o.Size), HostChosen: hostChosen(multiGPUSets(o.Sets))}
	for _, d := range devs {
		res.Devices = append(res.Devices, d.Name())
	}
	rels := []string{"multigpu-a.bin", "multigpu-b.bin"}
	fmt.Fprintf(os.Stderr, "making %s and %s (%s each) in %s\n", rels[0], rels[1], units.HumanBytes(int64(o.Size)), o.Dir)
	want, err := makeFile(filepath.Join(o.Dir, rels[0]), int64(o.Size), true)
	if err == nil {
		_, err = makeFile(filepath.Join(o.Dir, rels[1]), int64(o.Size), false)
	}
	if err != nil {
		devices.Close(devs)
		return err
	}
	res.Baselines = baselines(devs, int64(o.Size), o.Runs)
	res.Stagings, err = stagings(ctx, cfg, devs, o, rels)
	devices.Close(devs) // the daemon below opens them itself
	if err != nil {
		return err
	}
	if o.Consumers {
		res.Consumers = consumers(ctx, o, rels[0], want)
	}
	res.Checks = multiGPUChecks(res)
	if err := appendReport(o.Report, "multigpu", res); err != nil {
		return err
	}
	if o.JSON {
		json.NewEncoder(os.Stdout).Encode(res)
	} else {
		res.write(os.Stdout)
	}
	var failed []string
	for _, row := range res.Stagings {
		if row.Why != "" {
			failed = append(failed, row.Name+": "+row.Why)
		}
	}
	for _, v := range res.Consumers {
		if !v.OK {
			failed = append(failed, v.Name)
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("stagings or consumer checks failed: %s", strings.Join(failed, "; "))
	}
	return verdict(res.Checks)
}

// Row names the checks look up.
const (
	mgOne    = "file onto GPU 0"
	mgTwice  = "file onto both, one after the other (read twice)"
	mgSplit  = "file onto both, split ingest (read once)"
	mgPair   = "two files onto the two GPUs at once"
	mgMemcpy = "host memory bandwidth (memcpy)"
)

// baselines are the copy rates the stagings are compared with.
func baselines(devs []gpu.Device, size int64, runs int) []mgRow {
	total := min(max(size, 1<<30), 4<<30) // whole 512 MiB buffers
	total -= total % (512 << 20)
	var rows []mgRow
	for i, d := range devs {
		rows = append(rows, best(fmt.Sprintf("pinned H2D copy onto GPU %d", i), runs, total, func() (time.Duration, error) { return h2dCopy(d, total) }))
		rows[len(rows)-1].Detail = d.Name()
	}
	rows = append(rows, best("pinned H2D copy onto both at once", runs, 2*total, func() (time.Duration, error) { return h2dBoth(devs, total) }))
	for _, pair := range [][2]int{{0, 1}, {1, 0}} {
		name := fmt.Sprintf("peer copy GPU %d -> GPU %d", pair[0], pair[1])
		n := min(size, 4<<30)
		timed, free, err := peerCopy(devs[pair[0]], devs[pair[1]], n)
		if err != nil {
			rows = append(rows, mgRow{Name: name, Why: err.Error()})
			if free != nil {
				free()
			}
			continue
		}
		rows = append(rows, best(name, runs, n, timed))
		free()
	}
	n := min(size, 2<<30)
	return append(rows, best(mgMemcpy, runs, n, hostMemcpy(n)))
}

// stagings times the stagings of the files: twice from SOURCE (peer copies
// off), then with peer copies: one GPU, split ingest, a copy, both files.
func stagings(ctx context.Context, cfg *config.Config, devs []gpu.Device, o MultiGPUOptions, rels []string) ([]mgRow, error) {
	a, b, size := rels[0], rels[1], int64(o.Size)
	off, err := newMGCache(cfg, devs, o.Dir, staging.PeerOff, rels)
	if err != nil {
		return nil, err
	}
	d0, d1 := off.devs[0], off.devs[1]
	twice := func() (time.Duration, error) { return off.timed(ctx, on(a, d0), on(a, d1)) }
	twice() // untimed: buffers made, pages warm
	rows := []mgRow{best(mgTwice, o.Runs, 2*size, twice)}
	off.close()

	c, err := newMGCache(cfg, devs, o.Dir, staging.PeerAuto, rels)
	if err != nil {
		return nil, err
	}
	defer c.close()
	c.timed(ctx, on(a, d0, d1), on(b, d0, d1)) // untimed
	for i, d := range c.devs {
		name := mgOne
		if i > 0 {
			name = fmt.Sprintf("file onto GPU %d", i)
		}
		rows = append(rows, best(name, o.Runs, size, func() (time.Duration, error) { return c.timed(ctx, on(a, d)) }))
	}
	split0 := c.c.Stats().SplitLoads
	split := best(mgSplit, o.Runs, 2*size, func() (time.Duration, error) { return c.timed(ctx, on(a, d0, d1)) })
	if c.c.Stats().SplitLoads == split0 {
		split.Detail = "no split ingest: no peer access (gdsfs check), each replica read from SOURCE"
	}
	copied := best("file onto GPU 0, then copied to GPU 1", o.Runs, 2*size, func() (time.Duration, error) {
		return c.timed(ctx, on(a, d0), on(a, d1))
	})
	pair := best(mgPair, o.Runs, 2*size, func() (time.Duration, error) {
		return c.timed(ctx, append(on(a, d0), on(b, d1)...))
	})
	return append(rows, split, copied, pair), nil
}

func rowNamed(rows []mgRow, name string) mgRow {
	for _, r := range rows {
		if r.Name == name {
			return r
		}
	}
	return mgRow{Name: name, Why: "not measured"}
}

// multiGPUChecks are the benchmark's targets, from the figures of this run.
func multiGPUChecks(res *multiGPUResult) []Check {
	const goalSplit = "split ingest onto both <= 0.6 x staging twice (time)"
	const goalPair = "two files at once >= min(1.6 x one GPU, host memcpy)"
	if res.Kind != gpu.KindCUDA {
		return []Check{gpuOnly(goalSplit, res.HostChosen), gpuOnly(goalPair, res.HostChosen)}
	}
	twice, split := rowNamed(res.Stagings, mgTwice), rowNamed(res.Stagings, mgSplit)
	var ratio float64
	if twice.Seconds > 0 && split.Seconds > 0 {
		ratio = split.Seconds / twice.Seconds
	}
	one, pair, mem := rowNamed(res.Stagings, mgOne), rowNamed(res.Stagings, mgPair), rowNamed(res.Baselines, mgMemcpy)
	want := 1.6 * one.GBps
	if mem.GBps > 0 && mem.GBps < want {
		want = mem.GBps
	}
	return []Check{
		newCheck(goalSplit, ratio, 0.6, "x", true, "a staging failed"),
		newCheck(goalPair, pair.GBps, want, "GB/s", false, "a staging failed"),
	}
}

func (r *multiGPUResult) write(w io.Writer) {
	fmt.Fprintf(w, "devices %s (%s), files of %s\n", strings.Join(r.Devices, ", "), r.Kind, units.HumanBytes(r.FileBytes))
	for _, row := range r.Baselines {
		fmt.Fprintln(w, "baseline  "+row.String())
	}
	for _, row := range r.Stagings {
		fmt.Fprintln(w, "stage     "+row.String())
	}
	for _, v := range r.Consumers {
		fmt.Fprintln(w, v.String())
	}
	writeChecks(w, r.Checks)
}
