package bench

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"time"
)

// KvikOptions drive the KvikIO sweep of `gdsfs bench stage --kvikio`.
type KvikOptions struct {
	Bin     string        // kvikbench (../shared/peers/kvikio/build.sh); "" skips KvikIO
	Threads []int         // KVIKIO_NTHREADS values
	Tasks   []int64       // KVIKIO_TASK_SIZE values, bytes
	Runs    int           // kvikbench's RUNS: it prints the best of them
	Budget  time.Duration // once the sweep has spent this, later rounds run only the 3 best settings
	Limit   time.Duration // one kvikbench run
}

// kvikSetting is one point of the sweep.
type kvikSetting struct {
	Threads int   `json:"threads"`
	Task    int64 `json:"task_bytes"`
}

func (s kvikSetting) String() string {
	return fmt.Sprintf("%d threads x %d MiB", s.Threads, s.Task>>20)
}

// kvikLine is what kvikbench prints:
// "compat_mode_on=1 threads=16 task=4194304 bounce=16777216 warm GB/s=45.80".
type kvikLine struct {
	Compat  bool    `json:"compat_mode_on"`
	Threads int     `json:"threads"`
	Task    int64   `json:"task_bytes"`
	Bounce  int64   `json:"bounce_bytes"`
	Mode    string  `json:"mode"` // warm or cold
	GBps    float64 `json:"gbps"`
}

// parseKvikLine reads kvikbench's output: its last line with a GB/s figure.
func parseKvikLine(out string) (kvikLine, error) {
	var l kvikLine
	lines := strings.Split(strings.TrimSpace(out), "\n")
	line := ""
	for i := len(lines) - 1; i >= 0 && line == ""; i-- {
		if strings.Contains(lines[i], "GB/s=") {
			line = lines[i]
		}
	}
	if line == "" {
		return l, fmt.Errorf("no GB/s figure in kvikbench's output %q", tail(out, 200))
	}
	seen := map[string]bool{}
	for _, tok := range strings.Fields(line) {
		k, v, ok := strings.Cut(tok, "=")
		if !ok {
			if tok == "warm" || tok == "cold" {
				l.Mode = tok
			}
			continue
		}
		var err error
		switch k {
		case "compat_mode_on":
			l.Compat = v == "1"
		case "threads":
			l.Threads, err = strconv.Atoi(v)
		case "task":
			l.Task, err = strconv.ParseInt(v, 10, 64)
		case "bounce":
			l.Bounce, err = strconv.ParseInt(v, 10, 64)
		case "GB/s":
			l.GBps, err = strconv.ParseFloat(v, 64)
		}
		if err != nil {
			return l, fmt.Errorf("kvikbench: %s in %q: %w", k, line, err)
		}
		seen[k] = true
	}
	for _, k := range []string{"threads", "task", "GB/s"} {
		if !seen[k] {
			return l, fmt.Errorf("kvikbench: no %s= in %q", k, line)
		}
	}
	return l, nil
}

// kvikResult is one kvikbench run of a setting in a round.
type kvikResult struct {
	Setting kvikSetting `json:"setting"`
	Round   int         `json:"round"`
	GBps    float64     `json:"gbps,omitempty"`
	Err     string      `json:"error,omitempty"`
}

// runKvik runs kvikbench on file with s, compat mode on, and checks that
// it ran with what was asked.
func runKvik(ctx context.Context, o KvikOptions, file string, s kvikSetting) (kvikLine, error) {
	ctx, cancel := context.WithTimeout(ctx, o.Limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, o.Bin, file, strconv.Itoa(o.Runs))
	cmd.Env = append(os.Environ(), "KVIKIO_COMPAT_MODE=ON",
		"KVIKIO_NTHREADS="+strconv.Itoa(s.Threads), "KVIKIO_TASK_SIZE="+strconv.FormatInt(s.Task, 10))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return kvikLine{}, fmt.Errorf("kvikbench %s: %v: %s", s, err, tail(out.String(), 300))
	}
	l, err := parseKvikLine(out.String())
	switch {
	case err != nil:
		return l, err
	case !l.Compat:
		return l, fmt.Errorf("kvikbench %s: ran with compat mode off although KVIKIO_COMPAT_MODE=ON", s)
	case l.Threads != s.Threads || l.Task != s.Task:
		return l, fmt.Errorf("kvikbench ran with %d threads x %d bytes, asked %s", l.Threads, l.Task, s)
	}
	return l, nil
}

// kvikSweep is the sweep over rounds.
type kvikSweep struct {
	o       KvikOptions
	file    string
	spent   time.Duration
	Results []kvikResult `json:"results"`
}

func (o KvikOptions) settings() []kvikSetting {
	var out []kvikSetting
	for _, t := range o.Threads {
		for _, k := range o.Tasks {
			out = append(out, kvikSetting{Threads: t, Task: k})
		}
	}
	return out
}

// round runs round r: every setting, in an order rotated by r, or once
// the budget is spent the 3 best settings so far.
func (k *kvikSweep) round(ctx context.Context, r int) {
	set := k.o.settings()
	if k.spent > k.o.Budget && r > 0 {
		set = k.top(3)
	}
	if len(set) > 0 {
		rot := r % len(set)
		set = append(set[rot:], set[:rot]...)
	}
	for _, s := range set {
		start := time.Now()
		l, err := runKvik(ctx, k.o, k.file, s)
		k.spent += time.Since(start)
		res := kvikResult{Setting: s, Round: r, GBps: l.GBps}
		if err != nil {
			res.Err, res.GBps = err.Error(), 0
		}
		k.Results = append(k.Results, res)
	}
}

// bySetting is the best figure of each setting over the rounds, best first.
func (k *kvikSweep) bySetting() []kvikResult {
	best := map[kvikSetting]kvikResult{}
	for _, r := range k.Results {
		if b, ok := best[r.Setting]; !ok || r.GBps > b.GBps {
			best[r.Setting] = r
		}
	}
	var out []kvikResult
	for _, r := range best {
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.GBps != b.GBps {
			return a.GBps > b.GBps
		}
		if a.Setting.Threads != b.Setting.Threads {
			return a.Setting.Threads < b.Setting.Threads
		}
		return a.Setting.Task < b.Setting.Task
	})
	return out
}

func (k *kvikSweep) top(n int) []kvikSetting {
	var out []kvikSetting
	for _, r := range k.bySetting() {
		if r.GBps > 0 && len(out) < n {
			out = append(out, r.Setting)
		}
	}
	return out
}

// best is KvikIO's best figure and its setting (GBps 0: none ran).
func (k *kvikSweep) best() kvikResult {
	if b := k.bySetting(); len(b) > 0 && b[0].GBps > 0 {
		return b[0]
	}
	return kvikResult{}
}

// roundBest is KvikIO's best figure in round r.
func (k *kvikSweep) roundBest(r int) float64 {
	best := 0.0
	for _, res := range k.Results {
		if res.Round == r {
			best = max(best, res.GBps)
		}
	}
	return best
}

// firstError is the error of the first failed run, "" when none failed.
func (k *kvikSweep) firstError() string {
	for _, r := range k.Results {
		if r.Err != "" {
			return r.Err
		}
	}
	return ""
}
