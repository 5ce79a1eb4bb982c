package bench

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gdsfs/gdsfs/gpu"
)

func TestParseKvikLine(t *testing.T) {
	for _, tc := range []struct {
		name, out string
		want      kvikLine
		err       string
	}{
		{name: "warm", out: "compat_mode_on=1 threads=16 task=4194304 bounce=16777216 warm GB/s=45.80\n",
			want: kvikLine{Compat: true, Threads: 16, Task: 4 << 20, Bounce: 16 << 20, Mode: "warm", GBps: 45.8}},
		{name: "cold, chatter before", out: "some warning\ncompat_mode_on=0 threads=8 task=2097152 bounce=16777216 cold GB/s=1.50",
			want: kvikLine{Compat: false, Threads: 8, Task: 2 << 20, Bounce: 16 << 20, Mode: "cold", GBps: 1.5}},
		{name: "no compat field (0 runs)", out: "threads=8 task=2097152 bounce=1 warm GB/s=0.00",
			want: kvikLine{Threads: 8, Task: 2 << 20, Bounce: 1, Mode: "warm"}},
		{name: "no figure", out: "cudaMalloc failed\n", err: "no GB/s figure"},
		{name: "bad number", out: "threads=x task=1 warm GB/s=1", err: "threads"},
		{name: "missing task", out: "threads=8 warm GB/s=1.0", err: "no task="},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseKvikLine(tc.out)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

// fakeKvik writes a kvikbench stand-in: it prints the line kvikbench would,
// from the environment it was given, with GB/s = threads + task in MiB
// (so the best setting is known), or compat off / other threads on request.
func fakeKvik(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "kvikbench")
	script := "#!/bin/sh\n" + body + "\n"
	if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

const fakeGood = `[ "$KVIKIO_COMPAT_MODE" = ON ] || exit 3
[ "$2" = 3 ] || exit 4
mib=$((KVIKIO_TASK_SIZE / 1048576))
echo "compat_mode_on=1 threads=$KVIKIO_NTHREADS task=$KVIKIO_TASK_SIZE bounce=16777216 warm GB/s=$((KVIKIO_NTHREADS + mib)).00"`

func testKvikOptions(bin string) KvikOptions {
	return KvikOptions{Bin: bin, Threads: []int{8, 16}, Tasks: []int64{2 << 20, 4 << 20}, Runs: 3, Budget: time.Hour, Limit: time.Minute}
}

func TestKvikSweep(t *testing.T) {
	k := &kvikSweep{o: testKvikOptions(fakeKvik(t, fakeGood)), file: "/dev/null"}
	k.round(context.Background(), 0)
	k.round(context.Background(), 1)
	if len(k.Results) != 8 {
		t.Fatalf("%d results, want 8 (4 settings x 2 rounds)", len(k.Results))
	}
	if e := k.firstError(); e != "" {
		t.Fatalf("error %s", e)
	}
	// Round 1 runs the settings in another order than round 0.
	if k.Results[0].Setting == k.Results[4].Setting {
		t.Errorf("round 1 started with the same setting as round 0: %v", k.Results[0].Setting)
	}
	b := k.best()
	if b.Setting != (kvikSetting{Threads: 16, Task: 4 << 20}) || b.GBps != 20 {
		t.Errorf("best %+v, want 16 threads x 4 MiB at 20", b)
	}
	if got := k.roundBest(1); got != 20 {
		t.Errorf("round 1 best %v, want 20", got)
	}
	if got := k.rounds(kvikSetting{Threads: 8, Task: 2 << 20}); len(got) != 2 || got[0] != 10 {
		t.Errorf("8 x 2 MiB rounds %v, want [10 10]", got)
	}
}

func TestKvikSweepBudgetKeepsTheBest(t *testing.T) {
	o := testKvikOptions(fakeKvik(t, fakeGood))
	o.Budget = 0
	k := &kvikSweep{o: o, file: "/dev/null"}
	k.round(context.Background(), 0)
	k.round(context.Background(), 1)
	var second []kvikSetting
	for _, r := range k.Results {
		if r.Round == 1 {
			second = append(second, r.Setting)
		}
	}
	if len(second) != 3 {
		t.Fatalf("round 1 ran %v, want the 3 best settings only", second)
	}
	for _, s := range second {
		if s == (kvikSetting{Threads: 8, Task: 2 << 20}) {
			t.Errorf("round 1 ran the worst setting %v", s)
		}
	}
}

func TestKvikRefusesWhatWasNotAsked(t *testing.T) {
	for _, tc := range []struct{ name, body, err string }{
		{"compat off", `echo "compat_mode_on=0 threads=$KVIKIO_NTHREADS task=$KVIKIO_TASK_SIZE bounce=1 warm GB/s=9.00"`, "compat mode off"},
		{"other threads", `echo "compat_mode_on=1 threads=1 task=$KVIKIO_TASK_SIZE bounce=1 warm GB/s=9.00"`, "asked"},
		{"exit status", `echo boom; exit 1`, "boom"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := &kvikSweep{o: testKvikOptions(fakeKvik(t, tc.body)), file: "/dev/null"}
			k.round(context.Background(), 0)
			if e := k.firstError(); !strings.Contains(e, tc.err) {
				t.Fatalf("error %q, want one containing %q", e, tc.err)
			}
			if b := k.best(); b.GBps != 0 {
				t.Fatalf("best %+v from failed runs", b)
			}
		})
	}
}

func TestStageText(t *testing.T) {
	k := &kvikSweep{Results: []kvikResult{
		{Setting: kvikSetting{16, 4 << 20}, Round: 0, GBps: 46},
		{Setting: kvikSetting{8, 2 << 20}, Round: 0, GBps: 30},
		{Setting: kvikSetting{16, 4 << 20}, Round: 1, GBps: 47},
		{Setting: kvikSetting{8, 2 << 20}, Round: 1, Err: "kvikbench 8 threads x 2 MiB: exit status 1"},
	}}
	b := &stageBench{o: StageOptions{Kvik: KvikOptions{Bin: "kvikbench"}}, path: "f", size: 1, kvik: k, rows: []benchRow{
		{Name: rowH2D, Kind: "baseline", Warm: 55, Rounds: []float64{54, 55}},
		{Name: "gdsfs defaults", Kind: "defaults", Warm: 52, Rounds: []float64{51.5, 52}},
	}}
	b.dev = fakeCUDA{}
	res := b.result()
	if res.Ratio.OverKvik != 52.0/47 || res.Ratio.OverH2D != 52.0/55 || res.Ratio.KvikSetting != (kvikSetting{16, 4 << 20}) {
		t.Fatalf("ratios %+v", res.Ratio)
	}
	if len(res.Ratios) != 2 || res.Ratios[1].Kvik != 47 || res.Ratios[0].Ratio != 51.5/46 {
		t.Fatalf("per round %+v", res.Ratios)
	}
	var buf bytes.Buffer
	writeStageText(&buf, res)
	for _, want := range []string{
		"KvikIO compat 16 threads x 4 MiB (best)  47.00",
		"46.00 47.00",
		"failed: kvikbench 8 threads x 2 MiB: exit status 1",
		"round 2: gdsfs defaults 52.00 GB/s, KvikIO best of the round 47.00 GB/s, ratio 1.106",
		"gdsfs defaults / KvikIO best (16 threads x 4 MiB, 47.00 GB/s): 1.106 (target >= 1.1)",
		"gdsfs defaults / pinned host-to-device copy: 0.945 (target >= 0.9)",
		"gdsfs defaults >= 1.1 x KvikIO best (16 threads x 4 MiB)",
	} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("no %q in\n%s", want, buf.String())
		}
	}
}

// fakeCUDA is a gpu.Device that only says it is a GPU.
type fakeCUDA struct{ gpu.Device }

func (fakeCUDA) Kind() string { return gpu.KindCUDA }
func (fakeCUDA) Name() string { return "GPU-fake" }
