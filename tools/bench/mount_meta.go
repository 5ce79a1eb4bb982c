package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// The metadata case: `find` and `ls -lR` over a tree of --meta-files
// empty files (1,000 per directory), warm: after one untimed pass of each
// command, as a dataset indexed before every epoch is. Each figure is the
// best of --runs passes; the target is gdsfs within metaTarget x native.

const (
	metaDir     = "meta"
	metaPerDir  = 1000
	metaTarget  = 3.0
	metaFind    = "find"
	metaListing = "ls -lR"
)

// metaCommands are the timed commands, with the tree's root appended.
var metaCommands = map[string][]string{metaFind: {"find"}, metaListing: {"ls", "-lR"}}

// metaFigures are one filesystem's metadata figures.
type metaFigures struct {
	FindSeconds float64   `json:"find_s"`
	FindRuns    []float64 `json:"find_runs_s"`
	FindXNative float64   `json:"find_x_native"`
	ListSeconds float64   `json:"ls_lR_s"`
	ListRuns    []float64 `json:"ls_lR_runs_s"`
	ListXNative float64   `json:"ls_lR_x_native"`
}

// prepareMeta makes SOURCE/meta: MetaFiles empty files.
func (b *mountBench) prepareMeta(ctx context.Context) error {
	for i := range b.opts.MetaFiles {
		dir := filepath.Join(b.source, metaDir, fmt.Sprintf("d%04d", i/metaPerDir))
		if i%metaPerDir == 0 {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return fmt.Errorf("prepare SOURCE: %w", err)
			}
		}
		f, err := os.OpenFile(filepath.Join(dir, fmt.Sprintf("f%04d", i%metaPerDir)), os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			return fmt.Errorf("prepare SOURCE: %w", err)
		}
		f.Close()
	}
	return nil
}

// metaUnavailable says why the metadata case is not measured, or "".
func (b *mountBench) metaUnavailable() string {
	if b.opts.MetaFiles == 0 {
		return "--meta-files 0"
	}
	for _, argv := range metaCommands {
		if _, err := exec.LookPath(argv[0]); err != nil {
			return argv[0] + " not found"
		}
	}
	return ""
}

// measureMeta times find and ls -lR over the tree on native and the gdsfs
// mounts, interleaved, after one untimed pass of each.
func (b *mountBench) measureMeta(ctx context.Context) error {
	if b.metaUnavailable() != "" {
		return nil
	}
	b.say("timing find and ls -lR over %d files", b.opts.MetaFiles)
	var subjects []*subject
	for _, s := range b.active() {
		if s.fs.key == "native" || s.fs.gdsfs {
			subjects = append(subjects, s)
			s.row.Meta = &metaFigures{}
		}
	}
	for _, name := range []string{metaFind, metaListing} {
		for _, s := range subjects {
			if _, err := runMeta(ctx, name, s); err != nil {
				return err
			}
		}
		err := rounds(ctx, b.opts.Runs, subjects, func(s *subject) error {
			d, err := runMeta(ctx, name, s)
			if name == metaFind {
				s.row.Meta.FindRuns = append(s.row.Meta.FindRuns, d.Seconds())
			} else {
				s.row.Meta.ListRuns = append(s.row.Meta.ListRuns, d.Seconds())
			}
			return err
		})
		if err != nil {
			return err
		}
	}
	for _, s := range subjects {
		s.row.Meta.FindSeconds = fastest(s.row.Meta.FindRuns)
		s.row.Meta.ListSeconds = fastest(s.row.Meta.ListRuns)
	}
	return nil
}

// runMeta runs one timed command over s's tree, output discarded.
func runMeta(ctx context.Context, name string, s *subject) (time.Duration, error) {
	argv := append(append([]string(nil), metaCommands[name]...), filepath.Join(s.root, metaDir))
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	start := time.Now()
	err := cmd.Run()
	d := time.Since(start)
	if err != nil {
		return 0, fmt.Errorf("%s: %s: %w: %s", s.fs.name, strings.Join(argv, " "), err, strings.TrimSpace(stderr.String()))
	}
	return d, nil
}

func fastest(v []float64) float64 {
	best := 0.0
	for i, x := range v {
		if i == 0 || x < best {
			best = x
		}
	}
	return best
}

// metaTargets: find and ls -lR through gdsfs within metaTarget x native.
func (r *MountReport) metaTargets(why string) []mountTarget {
	native := r.row("native")
	row := r.row("gdsfs-passthrough")
	if row == nil || row.Meta == nil {
		row = r.row("gdsfs-no-passthrough")
	}
	var out []mountTarget
	for _, name := range []string{metaFind, metaListing} {
		t := mountTarget{Name: "gdsfs " + name, Want: fmt.Sprintf("<= %.2f x native", metaTarget)}
		switch {
		case why != "":
			t.Result, t.Detail = strings.TrimSuffix(statusNotHere, ": "), why
		case native == nil || native.Meta == nil || row == nil || row.Meta == nil:
			t.Result, t.Detail = strings.TrimSuffix(statusNoCheck, ": "), "no gdsfs mount measured"
		default:
			got, base := row.Meta.FindSeconds, native.Meta.FindSeconds
			if name == metaListing {
				got, base = row.Meta.ListSeconds, native.Meta.ListSeconds
			}
			t.Ratio = ratio(got, base)
			t.Result = verdictOf(t.Ratio <= metaTarget)
			t.Detail = fmt.Sprintf("%.3f s (%s) = %.2f x native %.3f s (best of runs)", got, row.Name, t.Ratio, base)
		}
		out = append(out, t)
	}
	return out
}

// metaRatios fills in the rows' ratios against native.
func (r *MountReport) metaRatios() {
	native := r.row("native")
	if native == nil || native.Meta == nil {
		return
	}
	for _, row := range r.Rows {
		if row.Meta != nil {
			row.Meta.FindXNative = ratio(row.Meta.FindSeconds, native.Meta.FindSeconds)
			row.Meta.ListXNative = ratio(row.Meta.ListSeconds, native.Meta.ListSeconds)
		}
	}
}

// writeMeta prints the metadata table.
func (r *MountReport) writeMeta(b *strings.Builder) {
	if r.MetaFiles == 0 {
		return
	}
	fmt.Fprintf(b, "\nmetadata: find and ls -lR over %d files (%d per directory), warm, best of %d runs\n", r.MetaFiles, metaPerDir, r.Runs)
	const head = "%-22s %9s %8s %9s %8s\n"
	fmt.Fprintf(b, head, "filesystem", "find s", "x native", "ls -lR s", "x native")
	for _, row := range r.Rows {
		if m := row.Meta; m != nil {
			fmt.Fprintf(b, "%-22s %9.3f %8.2f %9.3f %8.2f\n", row.Name, m.FindSeconds, m.FindXNative, m.ListSeconds, m.ListXNative)
		}
	}
}
