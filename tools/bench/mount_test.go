package bench

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func startFake(t *testing.T, ctx context.Context, script string) (*daemon, error) {
	t.Helper()
	dir := t.TempDir()
	return startDaemon(ctx, "fake", dir, filepath.Join(dir, "log"), []string{"/bin/sh", "-c", script}, readiness{notify: true})
}

func TestMbStartDaemonExits(t *testing.T) {
	for _, tc := range []struct {
		name, script, unavailable, errText string
	}{
		{
			name: "passthrough refused",
			script: `echo '{"level":"info","msg":"no GPU answers"}' >&2
echo 'gdsfs: fuse.passthrough: on, but the kernel does not offer FUSE passthrough (needs Linux >= 6.9)' >&2; exit 1`,
			unavailable: "kernel refuses passthrough: the kernel does not offer FUSE passthrough (needs Linux >= 6.9)",
		},
		{
			name:    "other failure",
			script:  `echo 'gdsfs: MOUNTPOINT /x: busy' >&2; exit 1`,
			errText: "MOUNTPOINT /x: busy",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := startFake(t, context.Background(), tc.script)
			if d != nil {
				t.Fatal("got a daemon from a process that exited")
			}
			var un *unavailableError
			switch {
			case tc.unavailable != "" && (!errors.As(err, &un) || un.reason != tc.unavailable):
				t.Fatalf("err = %v, want unavailable %q", err, tc.unavailable)
			case tc.errText != "" && (errors.As(err, &un) || err == nil || !strings.Contains(err.Error(), tc.errText)):
				t.Fatalf("err = %v, want an error naming %q", err, tc.errText)
			}
		})
	}
}

func TestMbStartDaemonCanceled(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := startFake(t, ctx, "exec sleep 30")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want the context's", err)
	}
	if el := time.Since(start); el > 10*time.Second {
		t.Fatalf("took %v: the daemon was not stopped by SIGTERM", el)
	}
}

func TestMountBenchTargets(t *testing.T) {
	row := func(key string, gbps, stat float64) *mountRow {
		return &mountRow{Key: key, Name: key, ReadGBps: gbps, StatPerSec: stat}
	}
	for _, tc := range []struct {
		name string
		rows []*mountRow
		want []string
	}{
		{"all pass", []*mountRow{row("native", 10, 1e5), row("gdsfs-passthrough", 9.6, 2e4),
			row("gdsfs-no-passthrough", 5, 2.1e4), row("loopback", 9, 2e4)}, []string{"PASS", "PASS", "PASS"}},
		{"all miss", []*mountRow{row("native", 10, 1e5), row("gdsfs-passthrough", 9.4, 2e4),
			row("gdsfs-no-passthrough", 4.9, 2.1e4), row("loopback", 9, 2.05e4)}, []string{"MISS", "MISS", "MISS"}},
		{"unavailable", []*mountRow{row("native", 10, 1e5), {Key: "gdsfs-passthrough", Unavailable: "no kernel"},
			row("gdsfs-no-passthrough", 5, 2e4), {Key: "loopback", Unavailable: statusNotHere + "no binary"}},
			[]string{"not checked", "PASS", "not measured here"}},
		{"loopback failed", []*mountRow{row("native", 10, 1e5), row("gdsfs-passthrough", 9.6, 2e4),
			row("gdsfs-no-passthrough", 5, 2e4), {Key: "loopback", Unavailable: "exited"}}, []string{"PASS", "PASS", "not checked"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &MountReport{Rows: tc.rows}
			r.evaluate("--meta-files 0")
			tc.want = append(tc.want, "not measured here", "not measured here")
			var got []string
			for _, tg := range r.Targets {
				got = append(got, tg.Result)
			}
			if strings.Join(got, " ") != strings.Join(tc.want, " ") {
				t.Fatalf("targets %v, want %v: %+v", got, tc.want, r.Targets)
			}
			var b strings.Builder
			if err := r.WriteText(&b); err != nil {
				t.Fatal(err)
			}
			// Only PASS and "not measured here" leave the run's exit status 0.
			ok := true
			for _, w := range tc.want {
				ok = ok && (w == "PASS" || w == "not measured here")
			}
			if err := r.Verdict(); (err == nil) != ok {
				t.Errorf("verdict %v, want ok=%v", err, ok)
			}
		})
	}
}

func TestMountBenchMetaTargets(t *testing.T) {
	row := func(key string, find, ls float64) *mountRow {
		return &mountRow{Key: key, Name: key, ReadGBps: 1, StatPerSec: 1, Meta: &metaFigures{FindSeconds: find, ListSeconds: ls}}
	}
	for _, tc := range []struct {
		name string
		rows []*mountRow
		want string
	}{
		{"within 3x", []*mountRow{row("native", 0.1, 1), row("gdsfs-passthrough", 0.29, 3)}, "PASS PASS"},
		{"past 3x", []*mountRow{row("native", 0.1, 1), row("gdsfs-passthrough", 0.31, 2)}, "MISS PASS"},
		{"no passthrough row", []*mountRow{row("native", 0.1, 1), {Key: "gdsfs-passthrough", Unavailable: "no kernel"},
			row("gdsfs-no-passthrough", 0.2, 3.5)}, "PASS MISS"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &MountReport{Rows: tc.rows, MetaFiles: 100}
			r.evaluate("")
			var got []string
			for _, tg := range r.Targets[3:] {
				got = append(got, tg.Result)
			}
			if strings.Join(got, " ") != tc.want {
				t.Fatalf("metadata targets %v, want %s: %+v", got, tc.want, r.Targets[3:])
			}
			var b strings.Builder
			if err := r.WriteText(&b); err != nil || !strings.Contains(b.String(), "ls -lR s") {
				t.Fatalf("text: %v\n%s", err, b.String())
			}
		})
	}
}
