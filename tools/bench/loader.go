package bench

import (
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/gdsfs/gdsfs/internal/units"
)

//go:embed loader.py
var loaderScript []byte

// LoaderOptions are the flags of `gdsfs bench loader`.
type LoaderOptions struct {
	Shards    int
	ShardSize units.Size
	Files     int
	FileSize  units.Size
	Big       units.Size // 0 skips the not-yet-resident load
	Epochs    int
	Runs      int
	Workers   int // DataLoader workers of the read() epochs
	Ahead     int // files leased ahead by gdsfs.torch, where present
	Dir       string
	Py        PyFlags
	Sets      []string
	JSON      bool
	Report    string
}

//go:embed loader.md
var loaderHelp string

// LoaderDoc is the long help of `gdsfs bench loader`: loader.md and the exit-status rule.
var LoaderDoc = loaderHelp + "\n" + VerdictRule

// Validate checks the options.
func (o LoaderOptions) Validate() error {
	switch {
	case os.Geteuid() != 0:
		return fmt.Errorf("bench loader mounts by syscall: run as root")
	case o.Shards < 0 || o.Files < 0 || o.Epochs < 1 || o.Runs < 1 || o.Workers < 0 || o.Ahead < 1:
		return fmt.Errorf("--shards, --files, --workers: want >= 0; --epochs, --runs, --ahead: want >= 1")
	case o.ShardSize%8 != 0 || o.FileSize%8 != 0 || o.Big%8 != 0:
		return fmt.Errorf("--shard-size, --file-size, --big: want multiples of 8 bytes (read as int64)")
	}
	return nil
}

// epochSet is one file set's figures, from loader.py.
type epochSet struct {
	Files     int       `json:"files"`
	Bytes     int64     `json:"bytes"`
	Lease     []float64 `json:"lease_gbps"` // per epoch
	Read      []float64 `json:"read_gbps"`  // per epoch
	SumsMatch bool      `json:"sums_match"`
	Error     string    `json:"error,omitempty"`
}

// bigLoad is the not-yet-resident load, from loader.py.
type bigLoad struct {
	Bytes  int64     `json:"bytes"`
	Load   []float64 `json:"load_gbps"`
	H2D    []float64 `json:"h2d_gbps"`
	H2DWhy string    `json:"h2d_unavailable,omitempty"`
	Error  string    `json:"error,omitempty"`
	// AfterRead: gdsfs.load after the file was read whole through the
	// mount (cat) and evicted.
	AfterRead      []float64 `json:"after_read_gbps"`
	AfterReadError string    `json:"after_read_error,omitempty"`
}

// loaderResult is the JSON of `gdsfs bench loader`.
type loaderResult struct {
	Device string               `json:"device"`
	Helper string               `json:"lease_helper"`
	Sets   map[string]*epochSet `json:"epochs"`
	Big    *bigLoad             `json:"big,omitempty"`
	Checks []Check              `json:"targets"`
	// HostChosen: staging.device=host (the rate targets are not measured here).
	HostChosen bool `json:"staging_device_host"`
	// Asked: the cases the flags asked for ("shards", "small", "big").
	Asked map[string]bool `json:"-"`
}

// Loader runs `gdsfs bench loader` and prints its report to stdout.
func Loader(ctx context.Context, o LoaderOptions) error {
	if err := openWorkDir("--dir", o.Dir); err != nil {
		return err
	}
	src := filepath.Join(o.Dir, "files")
	ph := newPhases("gdsfs bench loader")
	ph.start("files in %s: %d x %s, %d x %s, big %s", src, o.Shards, o.ShardSize, o.Files, o.FileSize, o.Big)
	shards, err := makeSet(src, "shards", "shard", o.Shards, int64(o.ShardSize))
	if err != nil {
		return err
	}
	small, err := makeSet(src, "small", "file", o.Files, int64(o.FileSize))
	if err != nil {
		return err
	}
	big := fmt.Sprintf("bench-%d.bin", int64(o.Big))
	if o.Big > 0 {
		if _, err := makeFile(filepath.Join(src, big), int64(o.Big), false); err != nil {
			return err
		}
	}
	py, err := newPyEnv(o.Py, filepath.Join(o.Dir, "py"), true)
	if err != nil {
		return err
	}
	if !py.Torch {
		return fmt.Errorf("bench loader needs torch: %s cannot import it (--python-bin)", py.Bin)
	}
	py.Echo = true // loader.py says each phase on stderr
	ph.start("mount")
	m, err := startMount(ctx, o.Dir, "loader", src, o.Sets)
	if err != nil {
		return err
	}
	defer m.stop()
	ph.start("staging %d files", len(shards)+len(small))
	if err := m.stageAll(ctx, append(append([]string{}, shards...), small...), 10*time.Minute); err != nil {
		return err
	}
	ph.start("python (%s)", py.Bin)
	res := &loaderResult{HostChosen: hostChosen(o.Sets), Asked: map[string]bool{"shards": o.Shards > 0, "small": o.Files > 0, "big": o.Big > 0}}
	if res.Device, err = m.device(); err != nil {
		return err
	}
	job := map[string]any{
		"mnt": m.mnt, "src": src, "gpu": res.Device != "host", "epochs": o.Epochs, "runs": o.Runs,
		"workers": o.Workers, "ahead": o.Ahead, "sets": map[string][]string{"shards": shards, "small": small},
	}
	if o.Big > 0 {
		job["big"] = big
	}
	if err := runLoaderScript(ctx, py, o.Dir, job, res); err != nil {
		return err
	}
	ph.done()
	res.Checks = loaderChecks(res)
	if err := printResult(os.Stdout, o.Report, "loader", res, o.JSON, func(w io.Writer) { writeLoaderText(w, res) }); err != nil {
		return err
	}
	return verdict(res.Checks)
}

func runLoaderScript(ctx context.Context, py *pyEnv, dir string, job map[string]any, res *loaderResult) error {
	script, err := py.write("bench_loader.py", loaderScript)
	if err != nil {
		return err
	}
	jobFile := filepath.Join(dir, "py", "loader-job.json")
	b, _ := json.Marshal(job)
	if err := writeNew(jobFile, b, 0o644); err != nil {
		return err
	}
	return py.runJSON(ctx, 8*time.Minute, res, script, jobFile)
}

// loaderTarget is one rate target over a file set's leased epochs.
type loaderTarget struct {
	set, what string
	want      float64
	pick      func([]float64) float64
}

var loaderTargets = []loaderTarget{
	{"shards", "best epoch", 30, bestOf},
	{"small", "best epoch", 10, bestOf},
	{"small", "first epoch", 5, firstOf},
}

// Ratios of the pinned host-to-device copy that the loads must reach.
const (
	bigOverH2D       = 0.87
	afterReadOverH2D = 0.85
)

// loaderChecks are the targets of `gdsfs bench loader`: rates on a GPU,
// the agreement of the bytes everywhere.
func loaderChecks(r *loaderResult) []Check {
	var out []Check
	gpuRun := r.Device != "host"
	gpuOnly := func(goal string) Check { return gpuOnly(goal, r.HostChosen) }
	for _, set := range []string{"shards", "small"} {
		s := r.Sets[set]
		if s == nil || s.Files == 0 {
			if r.Asked[set] {
				out = append(out, notChecked("case ran: "+set, "loader.py measured no epoch"))
			}
			continue
		}
		for _, t := range loaderTargets {
			if t.set != set {
				continue
			}
			goal := fmt.Sprintf("leased epoch over %d %s files, %s >= %g GB/s", s.Files, units.HumanBytes(s.Bytes/int64(s.Files)), t.what, t.want)
			if gpuRun {
				out = append(out, newCheck(goal, t.pick(s.Lease), t.want, "GB/s", false, s.Error))
			} else {
				out = append(out, gpuOnly(goal))
			}
		}
		out = append(out, boolCheck(fmt.Sprintf("%s: leased bytes sum as read() through the mount", set), s.SumsMatch && s.Error == "", s.Error))
	}
	if r.Big == nil && r.Asked["big"] {
		out = append(out, notChecked("case ran: big", "loader.py measured no load"))
	}
	if b := r.Big; b != nil {
		size := units.HumanBytes(b.Bytes)
		h2d := bestOf(b.H2D)
		for _, c := range []struct {
			goal      string
			loads     []float64
			err, none string
			over      float64
		}{
			{fmt.Sprintf("gdsfs.load, %s file not resident >= %g x pinned H2D", size, bigOverH2D), b.Load, b.Error, "", bigOverH2D},
			{fmt.Sprintf("cat, evict, gdsfs.load, %s file >= %g x pinned H2D", size, afterReadOverH2D), b.AfterRead, b.AfterReadError,
				"loader.py measured no load after a plain read", afterReadOverH2D},
		} {
			switch {
			case !gpuRun:
				out = append(out, gpuOnly(c.goal))
			case c.err != "":
				out = append(out, notChecked(c.goal, c.err))
			case len(c.loads) == 0 && c.none != "":
				out = append(out, notChecked(c.goal, c.none))
			default:
				out = append(out, newCheck(c.goal, bestOf(c.loads), c.over*h2d, "GB/s", false, b.H2DWhy))
			}
		}
	}
	return out
}

// firstOf is the first figure, 0 for none.
func firstOf(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	return xs[0]
}

func writeLoaderText(w io.Writer, r *loaderResult) {
	fmt.Fprintf(w, "resident files on %s; leases through %s; GB/s\n\n", r.Device, r.Helper)
	fmt.Fprintf(w, "%-48s %6s %8s %8s  %s\n", "epoch", "files", "first", "best", "every epoch")
	for _, name := range []string{"shards", "small"} {
		s := r.Sets[name]
		if s == nil || s.Files == 0 {
			continue
		}
		size := units.HumanBytes(s.Bytes / int64(s.Files))
		for _, m := range []struct {
			what string
			xs   []float64
		}{{"leases", s.Lease}, {"read() through the mount", s.Read}} {
			fmt.Fprintf(w, "%-48s %6d %8s %8s  %s\n", fmt.Sprintf("%s x %s, %s", name, size, m.what), s.Files, num(firstOf(m.xs)), num(bestOf(m.xs)), joinNums(m.xs))
		}
		if rd := bestOf(s.Read); rd > 0 {
			fmt.Fprintf(w, "%-48s %6s %8s %8s\n", name+": leases / read(), best epochs", "", "", num(bestOf(s.Lease)/rd)+"x")
		}
		if s.Error != "" {
			fmt.Fprintf(w, "%s: failed: %s\n", name, s.Error)
		}
	}
	if b := r.Big; b != nil {
		fmt.Fprintf(w, "\ngdsfs.load of a %s file not yet resident (page cache warm): best %s GB/s (runs %s)\n",
			units.HumanBytes(b.Bytes), num(bestOf(b.Load)), joinNums(b.Load))
		if b.Error != "" {
			fmt.Fprintf(w, "failed: %s\n", b.Error)
		}
		fmt.Fprintf(w, "cat MOUNT/f, evict f, then gdsfs.load(MOUNT/f): best %s GB/s (runs %s)\n", num(bestOf(b.AfterRead)), joinNums(b.AfterRead))
		if b.AfterReadError != "" {
			fmt.Fprintf(w, "failed: %s\n", b.AfterReadError)
		}
		if b.H2DWhy != "" {
			fmt.Fprintf(w, "pinned host-to-device copy: %s\n", b.H2DWhy)
		} else {
			h := max(bestOf(b.H2D), 1e-9)
			fmt.Fprintf(w, "pinned host-to-device copy: best %s GB/s; ratios %s (not resident), %s (after a plain read)\n",
				num(bestOf(b.H2D)), num(bestOf(b.Load)/h), num(bestOf(b.AfterRead)/h))
		}
	}
	fmt.Fprintln(w)
	writeChecks(w, r.Checks)
}
