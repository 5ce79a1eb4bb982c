package bench

import (
	"context"
	_ "embed"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"time"
)

//go:embed autoload.py
var autoloadScript []byte

// AutoloadOverheadOptions are the flags of `gdsfs bench autoload-overhead`.
type AutoloadOverheadOptions struct {
	Calls  int // calls per timed round
	Rounds int // rounds of each call, plain and wrapped alternating
	Dir    string
	Py     PyFlags
	Sets   []string
	JSON   bool
	Report string
}

// AutoloadOverheadDoc is the long help of `gdsfs bench autoload-overhead`.
const AutoloadOverheadDoc = `What the autoloader (gdsfs run, docs/frameworks.md) adds to every
Tensor.to, .cuda and .copy_ of a CPU tensor that is not a mapping of a
gdsfs file: the loop of a training job must not slow down. One Python
process (python3 with torch, numpy) maps a file of a mount this command
starts (np.load(mmap_mode="r"), so the autoloader's index is not empty) and
times each call on a 1000-element tensor elsewhere in memory, plain (the
original torch method) and through the autoloader's wrapper, in
interleaved rounds; the least time per call of each is kept. Calls:
x.to(float64), x.to("cpu"), copy_ into a CPU tensor and, where torch sees
a GPU, x.to("cuda"), x.cuda() and copy_ into a CUDA tensor. Targets: at
most 2 us added per call (PASS/MISS); none of the calls rebuilt the index,
was served or fell back (FAIL otherwise). Needs root (it mounts).

` + VerdictRule

// Validate checks the options.
func (o AutoloadOverheadOptions) Validate() error {
	switch {
	case os.Geteuid() != 0:
		return fmt.Errorf("bench autoload-overhead mounts by syscall: run as root")
	case o.Calls < 1 || o.Rounds < 2:
		return fmt.Errorf("--calls: want >= 1; --rounds: want >= 2")
	}
	return nil
}

// maxAddedNs is the target: what the wrapper may add to one call.
const maxAddedNs = 2000

type overheadCall struct {
	PlainNs   float64 `json:"plain_ns"`
	WrappedNs float64 `json:"wrapped_ns"`
	AddedNs   float64 `json:"added_ns"`
}

type overheadResult struct {
	Calls         map[string]overheadCall `json:"calls"`
	GPU           *string                 `json:"gpu"`
	Torch         string                  `json:"torch"`
	Python        string                  `json:"python"`
	IndexEntries  int                     `json:"index_entries"`
	IndexRebuilds int                     `json:"index_rebuilds"`
	Served        map[string]int          `json:"served"`
	Fallbacks     map[string]any          `json:"fallbacks"`
	Checks        []Check                 `json:"checks"`
}

// AutoloadOverhead runs the benchmark and prints its report; the error is
// the verdict.
func AutoloadOverhead(ctx context.Context, o AutoloadOverheadOptions) error {
	if err := openWorkDir("--dir", o.Dir); err != nil {
		return err
	}
	work := filepath.Join(o.Dir, "autoload-overhead")
	src := filepath.Join(work, "src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		return err
	}
	py, err := newPyEnv(o.Py, filepath.Join(work, "py"), true)
	if err != nil {
		return err
	}
	if !py.Torch {
		return fmt.Errorf("%s does not import torch (--python-bin)", py.Bin)
	}
	m, err := startMount(ctx, work, "overhead", src, o.Sets)
	if err != nil {
		return err
	}
	defer m.stop()
	script, err := py.write("bench_autoload.py", autoloadScript)
	if err != nil {
		return err
	}
	res := &overheadResult{}
	err = py.runJSON(ctx, 10*time.Minute, res, script, "--src", src, "--mnt", m.mnt,
		"--calls", fmt.Sprint(o.Calls), "--rounds", fmt.Sprint(o.Rounds))
	if err != nil {
		return err
	}
	res.Checks = overheadChecks(res)
	if err := printResult(os.Stdout, o.Report, "autoload-overhead", res, o.JSON, func(w io.Writer) { writeOverheadText(w, res) }); err != nil {
		return err
	}
	return verdict(res.Checks)
}

func overheadNames(res *overheadResult) []string {
	names := make([]string, 0, len(res.Calls))
	for n := range res.Calls {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

func overheadChecks(res *overheadResult) []Check {
	var checks []Check
	for _, n := range overheadNames(res) {
		c := res.Calls[n]
		st := statusPass
		if c.AddedNs > maxAddedNs {
			st = statusMiss
		}
		checks = append(checks, Check{Goal: "added per call, " + n, Got: max(c.AddedNs, 0) / 1000,
			Want: maxAddedNs / 1000, Unit: "us", AtMost: true, Status: st})
	}
	if len(res.Calls) == 0 {
		checks = append(checks, notChecked("added per call", "the script timed no call"))
	}
	checks = append(checks,
		boolCheck("a gdsfs mapping in the index", res.IndexEntries > 0, ""),
		boolCheck("no rebuild of the index", res.IndexRebuilds == 0, fmt.Sprintf("%d rebuilds", res.IndexRebuilds)),
		boolCheck("nothing served or fallen back", len(res.Served) == 0 && len(res.Fallbacks) == 0,
			fmt.Sprintf("served %v, fallbacks %v", res.Served, res.Fallbacks)))
	return checks
}

func writeOverheadText(w io.Writer, res *overheadResult) {
	gpu := "no GPU"
	if res.GPU != nil {
		gpu = *res.GPU
	}
	fmt.Fprintf(w, "autoload-overhead: torch %s, Python %s, %s\n", res.Torch, res.Python, gpu)
	fmt.Fprintf(w, "%-24s %10s %10s %10s\n", "call", "plain ns", "wrapped ns", "added ns")
	for _, n := range overheadNames(res) {
		c := res.Calls[n]
		fmt.Fprintf(w, "%-24s %10.0f %10.0f %10.0f\n", n, c.PlainNs, c.WrappedNs, c.AddedNs)
	}
	for _, c := range res.Checks {
		fmt.Fprintln(w, c)
	}
}
