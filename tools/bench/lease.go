package bench

import (
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/gdsfs/gdsfs/client"
	"github.com/gdsfs/gdsfs/daemon/config"
	"github.com/gdsfs/gdsfs/internal/units"
)

//go:embed lease.py
var leaseScript []byte

// LeaseOptions are the flags of `gdsfs bench lease`.
type LeaseOptions struct {
	Sizes  []units.Size // resident files leased
	Runs   int          // repeat leases (and floor cycles) timed per size
	First  int          // processes timing a first lease per size
	Dir    string       // work directory (a disk filesystem); SOURCE is DIR/files
	Py     PyFlags
	Sets   []string // config.yaml keys for the mount (and the floor's device)
	JSON   bool
	Report string
}

//go:embed lease.md
var leaseHelp string

// LeaseDoc is the long help of `gdsfs bench lease`: lease.md and the exit-status rule.
var LeaseDoc = leaseHelp + "\n" + VerdictRule

// Validate checks the options.
func (o LeaseOptions) Validate() error {
	switch {
	case os.Geteuid() != 0:
		return fmt.Errorf("bench lease mounts by syscall: run as root")
	case o.Runs < 1 || o.First < 1:
		return fmt.Errorf("--runs %d, --first %d: want at least 1", o.Runs, o.First)
	case len(o.Sizes) == 0:
		return fmt.Errorf("--sizes: want at least one size")
	}
	_, err := config.Load("", o.Sets)
	return err
}

// leaseRow is one measured quantity, the median (ms) per file size.
type leaseRow struct {
	Name    string             `json:"name"`
	Samples int                `json:"samples"`
	Median  map[string]float64 `json:"median_ms"` // by size name
	Why     string             `json:"unavailable,omitempty"`
}

// leaseResult is the JSON of `gdsfs bench lease`.
type leaseResult struct {
	Device string `json:"device"`
	// HostChosen: staging.device=host (the GPU targets are not measured here).
	HostChosen bool       `json:"staging_device_host"`
	Sizes      []string   `json:"sizes"`
	FastPath   string     `json:"python_fast_path"`
	Rows       []leaseRow `json:"rows"`
	Checks     []Check    `json:"targets"`
}

const (
	rowGoFirst  = "Go first lease"
	rowGoRepeat = "Go repeat lease"
	rowGoClose  = "Go release (Close)"
	rowPyFirst  = "Python first lease"
	rowPyRepeat = "Python repeat lease"
	rowPyClose  = "Python release (close)"
	rowPyLoad   = "Python gdsfs.load -> tensor read"
	rowFloor    = "floor: export + send + import + map"
)

// Lease runs `gdsfs bench lease` and prints its table to stdout.
func Lease(ctx context.Context, o LeaseOptions) error {
	if err := openWorkDir("--dir", o.Dir); err != nil {
		return err
	}
	src := filepath.Join(o.Dir, "files")
	lb := &leaseBench{o: o, res: &leaseResult{HostChosen: hostChosen(o.Sets)}}
	warm := filepath.Join("lease", "warm.bin")
	if _, err := makeFile(filepath.Join(src, warm), 64<<10, false); err != nil {
		return err
	}
	for _, s := range o.Sizes {
		rel := filepath.Join("lease", fmt.Sprintf("lease-%d.bin", int64(s)))
		if _, err := makeFile(filepath.Join(src, rel), int64(s), false); err != nil {
			return err
		}
		lb.rels = append(lb.rels, rel)
		lb.res.Sizes = append(lb.res.Sizes, s.String())
	}
	m, err := startMount(ctx, o.Dir, "lease", src, o.Sets)
	if err != nil {
		return err
	}
	defer m.stop()
	lb.m, lb.warm = m, warm
	if err := m.stageAll(ctx, append([]string{warm}, lb.rels...), 5*time.Minute); err != nil {
		return err
	}
	if lb.res.Device, err = m.device(); err != nil {
		return err
	}
	if err := lb.run(ctx); err != nil {
		return err
	}
	lb.res.Checks = leaseChecks(*lb.res)
	if err := printResult(os.Stdout, o.Report, "lease", lb.res, o.JSON, func(w io.Writer) { writeLeaseText(w, lb.res) }); err != nil {
		return err
	}
	return verdict(lb.res.Checks)
}

type leaseBench struct {
	o    LeaseOptions
	m    *benchMount
	warm string
	rels []string
	py   *pyEnv
	res  *leaseResult
}

func (lb *leaseBench) paths() []string {
	var out []string
	for _, r := range lb.rels {
		out = append(out, lb.m.path(r))
	}
	return out
}

func (lb *leaseBench) run(ctx context.Context) error {
	py, pyErr := newPyEnv(lb.o.Py, filepath.Join(lb.o.Dir, "py"), true)
	lb.py = py
	first, err := lb.goFirst(ctx)
	if err != nil {
		return err
	}
	lb.add(rowGoFirst, first, nil)
	rep, cls, err := goRepeat(lb.paths(), lb.o.Runs)
	if err != nil {
		return err
	}
	lb.add(rowGoRepeat, rep, nil)
	lb.add(rowGoClose, cls, nil)
	if pyErr != nil {
		for _, n := range []string{rowPyFirst, rowPyRepeat, rowPyClose, rowPyLoad} {
			lb.add(n, nil, pyErr)
		}
	} else {
		lb.pyRows(ctx)
	}
	floor, err := lb.floor(ctx)
	lb.add(rowFloor, floor, err)
	return nil
}

// add records samples (by path) as a row of medians by size.
func (lb *leaseBench) add(name string, samples map[string][]float64, err error) {
	row := leaseRow{Name: name, Median: map[string]float64{}}
	if err != nil {
		row.Why = err.Error()
	}
	for i, p := range lb.paths() {
		xs := samples[p]
		if len(xs) > 0 {
			row.Samples = len(xs)
			row.Median[lb.res.Sizes[i]] = median(xs)
		}
	}
	lb.res.Rows = append(lb.res.Rows, row)
}

// goFirst runs First child processes (this binary, `bench lease-child`),
// each timing the first lease of every file, in an order rotated per child.
func (lb *leaseBench) goFirst(ctx context.Context) (map[string][]float64, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	out := map[string][]float64{}
	paths := lb.paths()
	for i := range lb.o.First {
		rot := append(append([]string{}, paths[i%len(paths):]...), paths[:i%len(paths)]...)
		args := append([]string{"bench", "lease-child", "--warm", lb.m.path(lb.warm)}, rot...)
		cctx, cancel := context.WithTimeout(ctx, time.Minute)
		b, err := exec.CommandContext(cctx, exe, args...).CombinedOutput()
		cancel()
		if err != nil {
			return nil, fmt.Errorf("bench lease-child: %v: %s", err, tail(string(b), 400))
		}
		var r struct {
			First map[string]float64 `json:"first_ms"`
		}
		if err := lastJSONLine(b, &r); err != nil {
			return nil, err
		}
		for p, ms := range r.First {
			out[p] = append(out[p], ms)
		}
	}
	return out, nil
}

// LeaseChild is `gdsfs bench lease-child`: a lease of warm (CUDA and the
// connection come up), then the first lease of each path, timed to a
// usable pointer. It prints {"first_ms": {path: ms}}.
func LeaseChild(w io.Writer, warm string, paths []string) error {
	l, err := client.Open(warm)
	if err != nil {
		return err
	}
	l.Ptr()
	l.Close()
	res := map[string]float64{}
	for _, p := range paths {
		start := time.Now()
		l, err := client.Open(p)
		if err != nil {
			return err
		}
		if l.Ptr() == 0 {
			return fmt.Errorf("lease of %s has no pointer", p)
		}
		res[p] = ms(time.Since(start))
		l.Close()
	}
	return json.NewEncoder(w).Encode(map[string]any{"first_ms": res})
}

func ms(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e6 }

// goRepeat times, in this process, runs repeat leases of each path (after
// one untimed) to a usable pointer, and the Close after each.
func goRepeat(paths []string, runs int) (acq, cls map[string][]float64, err error) {
	acq, cls = map[string][]float64{}, map[string][]float64{}
	for _, p := range paths {
		for i := range runs + 1 {
			start := time.Now()
			l, err := client.Open(p)
			if err != nil {
				return nil, nil, err
			}
			if l.Ptr() == 0 {
				return nil, nil, fmt.Errorf("lease of %s has no pointer", p)
			}
			mid := time.Now()
			if err := l.Close(); err != nil {
				return nil, nil, err
			}
			if i > 0 {
				acq[p] = append(acq[p], ms(mid.Sub(start)))
				cls[p] = append(cls[p], ms(time.Since(mid)))
			}
		}
	}
	return acq, cls, nil
}

// pyRows runs lease.py: First processes for the first lease, one for the
// repeat leases and gdsfs.load.
func (lb *leaseBench) pyRows(ctx context.Context) {
	script, err := lb.py.write("bench_lease.py", leaseScript)
	first := map[string][]float64{}
	paths := lb.paths()
	for i := 0; i < lb.o.First && err == nil; i++ {
		rot := append(append([]string{}, paths[i%len(paths):]...), paths[:i%len(paths)]...)
		var r struct {
			First map[string]float64 `json:"first_ms"`
		}
		err = lb.py.runJSON(ctx, time.Minute, &r, script, append([]string{"first", lb.m.path(lb.warm)}, rot...)...)
		for p, v := range r.First {
			first[p] = append(first[p], v)
		}
	}
	lb.add(rowPyFirst, first, err)
	var r struct {
		FastPath bool                 `json:"fast_path"`
		Repeat   map[string][]float64 `json:"repeat_ms"`
		Close    map[string][]float64 `json:"close_ms"`
		Load     map[string][]float64 `json:"load_ms"`
		LoadWhy  string               `json:"load_unavailable"`
	}
	if err == nil {
		err = lb.py.runJSON(ctx, 5*time.Minute, &r, script, append([]string{"repeat", strconv.Itoa(lb.o.Runs)}, paths...)...)
	}
	lb.res.FastPath = map[bool]string{true: "yes (gdsfs.open_many present)", false: "no (client without open_many)"}[r.FastPath]
	lb.add(rowPyRepeat, r.Repeat, err)
	lb.add(rowPyClose, r.Close, err)
	if err == nil && r.LoadWhy != "" {
		err = fmt.Errorf("%s", r.LoadWhy)
	}
	lb.add(rowPyLoad, r.Load, err)
}
