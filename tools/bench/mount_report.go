package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/internal/units"
)

// mountRow is one filesystem's results: read rates the best of the runs,
// stat rates their median.
type mountRow struct {
	Key         string `json:"key"`
	Name        string `json:"name"`
	Unavailable string `json:"unavailable,omitempty"` // why it was not measured
	// Passthrough: whether reads bypassed the daemon (gdsfs: stats.json;
	// loopback: judged from DaemonReads). Absent for native.
	Passthrough *bool `json:"passthrough,omitempty"`
	// DaemonReads during the timed read passes: gdsfs reads_served, or the
	// loopback's read system calls.
	DaemonReads   uint64       `json:"daemon_reads"`
	ReadGBps      float64      `json:"read_gbps"`
	ReadRunsGBps  []float64    `json:"read_runs_gbps"`
	ReadXNative   float64      `json:"read_x_native"`
	StatPerSec    float64      `json:"stat_files_per_s"`
	StatRuns      []float64    `json:"stat_runs_files_per_s"`
	StatXNative   float64      `json:"stat_x_native"`
	StatXLoopback float64      `json:"stat_x_loopback,omitempty"` // gdsfs rows
	Meta          *metaFigures `json:"metadata,omitempty"`        // native and gdsfs rows (mount_meta.go)
	Notes         []string     `json:"notes,omitempty"`
}

// mountTarget is one goal with its verdict: PASS, MISS, "not checked" or
// "not measured here" (VerdictRule).
type mountTarget struct {
	Name   string  `json:"name"`
	Want   string  `json:"want"`
	Result string  `json:"result"`
	Ratio  float64 `json:"ratio"`
	Detail string  `json:"detail"`
}

// MountReport is what `gdsfs bench mount` prints.
type MountReport struct {
	Kernel         string        `json:"kernel"`
	Dir            string        `json:"dir"`
	SizeBytes      int64         `json:"size_bytes"`
	ReadBlockBytes int           `json:"read_block_bytes"`
	Files          int           `json:"files"`
	MetaFiles      int           `json:"meta_files"`
	FileBytes      int           `json:"file_bytes"`
	Runs           int           `json:"runs"`
	Statistic      string        `json:"statistic"`
	Rows           []*mountRow   `json:"rows"`
	Targets        []mountTarget `json:"targets"`
}

func (b *mountBench) newReport() *MountReport {
	var u unix.Utsname
	unix.Uname(&u)
	return &MountReport{
		Kernel: unix.ByteSliceToString(u.Release[:]), Dir: b.dir,
		SizeBytes: int64(b.opts.Size), ReadBlockBytes: readBlock,
		Files: b.opts.Files, MetaFiles: b.opts.MetaFiles, FileBytes: smallSize, Runs: b.opts.Runs, Statistic: "reads: best of runs; stat: median of runs",
	}
}

func (r *MountReport) row(key string) *mountRow {
	for _, row := range r.Rows {
		if row.Key == key && row.Unavailable == "" {
			return row
		}
	}
	return nil
}

// evaluate fills in the ratios and the targets; metaWhy says why the
// metadata case was not measured ("" when it was).
func (r *MountReport) evaluate(metaWhy string) {
	native, lb := r.row("native"), r.row("loopback")
	for _, row := range r.Rows {
		if row.Unavailable != "" {
			continue
		}
		row.ReadXNative = ratio(row.ReadGBps, native.ReadGBps)
		row.StatXNative = ratio(row.StatPerSec, native.StatPerSec)
		if lb != nil && strings.HasPrefix(row.Key, "gdsfs") {
			row.StatXLoopback = ratio(row.StatPerSec, lb.StatPerSec)
		}
	}
	r.Targets = []mountTarget{
		r.readTarget("gdsfs-passthrough", 0.95),
		r.readTarget("gdsfs-no-passthrough", 0.5),
		r.statTarget(),
	}
	r.metaRatios()
	r.Targets = append(r.Targets, r.metaTargets(metaWhy)...)
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

func verdictOf(ok bool) string {
	if ok {
		return "PASS"
	}
	return "MISS"
}

// readTarget: the row's read throughput is at least want x native.
func (r *MountReport) readTarget(key string, want float64) mountTarget {
	native := r.row("native")
	t := mountTarget{Name: strings.ReplaceAll(key, "-", " ") + " read", Want: fmt.Sprintf(">= %.2f x native", want)}
	row := r.row(key)
	if row == nil {
		t.Result, t.Detail = unmeasured(r.why(key))
		return t
	}
	t.Ratio = row.ReadXNative
	t.Result = verdictOf(t.Ratio >= want)
	t.Detail = fmt.Sprintf("%.2f GB/s = %.2f x native %.2f GB/s", row.ReadGBps, t.Ratio, native.ReadGBps)
	return t
}

// statTarget: gdsfs stats at least as fast as the loopback, compared like
// for like: the gdsfs mount in the loopback's read mode (passthrough, which
// the loopback example uses as root), or the other one where that mode is
// unavailable. Medians of the runs: one lucky run decides nothing.
func (r *MountReport) statTarget() mountTarget {
	t := mountTarget{Name: "gdsfs stat", Want: ">= 1.00 x loopback"}
	lb := r.row("loopback")
	row := r.row("gdsfs-passthrough")
	if row == nil || row.StatPerSec == 0 {
		row = r.row("gdsfs-no-passthrough")
	}
	switch {
	case lb == nil:
		t.Result, t.Detail = unmeasured(r.why("loopback"))
		t.Detail = "loopback: " + t.Detail
		return t
	case row == nil:
		t.Result, t.Detail = strings.TrimSuffix(statusNoCheck, ": "), "no gdsfs mount measured"
		return t
	}
	t.Ratio = row.StatXLoopback
	t.Result = verdictOf(row.StatPerSec >= lb.StatPerSec)
	t.Detail = fmt.Sprintf("%.0f files/s (%s) = %.2f x loopback %.0f files/s (medians)",
		row.StatPerSec, row.Name, t.Ratio, lb.StatPerSec)
	return t
}

// unmeasured is the result and detail of a target whose row has no
// figure: not measured here where the user left the row out, else not
// checked.
func unmeasured(why string) (result, detail string) {
	if d, ok := strings.CutPrefix(why, statusNotHere); ok {
		return strings.TrimSuffix(statusNotHere, ": "), d
	}
	return strings.TrimSuffix(statusNoCheck, ": "), why
}

// Verdict is the run's outcome (VerdictRule): nil when every target
// passed or is not measured here.
func (r *MountReport) Verdict() error {
	var checks []Check
	for _, t := range r.Targets {
		c := Check{Goal: t.Name + " " + t.Want, Status: t.Result}
		if t.Result == strings.TrimSuffix(statusNotHere, ": ") {
			c.Status = statusNotHere + t.Detail
		}
		checks = append(checks, c)
	}
	return verdict(checks)
}

func (r *MountReport) why(key string) string {
	for _, row := range r.Rows {
		if row.Key == key {
			return row.Unavailable
		}
	}
	return "not measured"
}

func (r *MountReport) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteText prints the table, the targets and any notes.
func (r *MountReport) WriteText(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "gdsfs bench mount: kernel %s; read: one %s file, %d KiB reads, page cache warm, fresh open per pass;\n",
		r.Kernel, units.Size(r.SizeBytes), r.ReadBlockBytes>>10)
	fmt.Fprintf(&b, "stat: lstat of %d files of %d B, dentries dropped before each pass; reads best of %d runs, stat median\n\n", r.Files, r.FileBytes, r.Runs)
	const head = "%-22s %9s %8s %13s %8s %10s  %s\n"
	fmt.Fprintf(&b, head, "filesystem", "read GB/s", "x native", "stat files/s", "x native", "x loopback", "passthrough")
	for _, row := range r.Rows {
		if row.Unavailable != "" {
			why := row.Unavailable
			if !strings.HasPrefix(why, statusNotHere) {
				why = "unavailable: " + why
			}
			fmt.Fprintf(&b, "%-22s %s\n", row.Name, why)
			continue
		}
		fmt.Fprintf(&b, "%-22s %9.2f %8.2f %13.0f %8.2f %10s  %s\n", row.Name, row.ReadGBps, row.ReadXNative,
			row.StatPerSec, row.StatXNative, optRatio(row.StatXLoopback), passthroughText(row))
	}
	r.writeMeta(&b)
	b.WriteString("\ntargets\n")
	for _, t := range r.Targets {
		fmt.Fprintf(&b, "target  %-4s  %-26s %-20s %s\n", t.Result, t.Name, t.Want, t.Detail)
	}
	for _, row := range r.Rows {
		for _, n := range row.Notes {
			fmt.Fprintf(&b, "note: %s: %s\n", row.Name, n)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func optRatio(v float64) string {
	if v == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", v)
}

func passthroughText(row *mountRow) string {
	if row.Passthrough == nil {
		return "-"
	}
	yes := "no"
	if *row.Passthrough {
		yes = "yes"
	}
	return fmt.Sprintf("%s (%d daemon reads)", yes, row.DaemonReads)
}
