package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gdsfs/gdsfs/daemon/config"
	"github.com/gdsfs/gdsfs/scripts"
)

func TestCheckStatus(t *testing.T) {
	for _, tc := range []struct {
		name      string
		got, want float64
		atMost    bool
		status    string
		line      string
	}{
		{"at least, met", 33, 30, false, statusPass, "PASS  33.00 >= 30.00 GB/s"},
		{"at least, missed", 29, 30, false, statusMiss, "MISS  29.00 <  30.00 GB/s"},
		{"at most, met", 0.2, 0.3, true, statusPass, "PASS  0.200 <= 0.300 GB/s"},
		{"at most, missed", 0.4, 0.3, true, statusMiss, "MISS  0.400 >  0.300 GB/s"},
		{"not measured", 0, 30, false, "not checked: why", "not checked: why"},
		{"no baseline", 5, 0, false, "not checked: why", "not checked: why"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCheck("goal", tc.got, tc.want, "GB/s", tc.atMost, "why")
			if c.Status != tc.status || !strings.Contains(c.String(), tc.line) {
				t.Fatalf("status %q line %q, want %q and %q", c.Status, c.String(), tc.status, tc.line)
			}
		})
	}
	if c := gpuOnly("g", true); !strings.HasSuffix(c.String(), "not measured here: host backend (staging.device=host)") {
		t.Errorf("GPU target on the host backend chosen: %q", c.String())
	}
	if c := gpuOnly("g", false); !strings.HasPrefix(c.Status, "not checked: no GPU") {
		t.Errorf("GPU target on the host backend not chosen: %q", c.Status)
	}
	if c := boolCheck("g", true, ""); c.String() != "target  "+padGoal("g")+" PASS" {
		t.Errorf("bool check %q", c.String())
	}
	if c := boolCheck("g", false, ""); c.Status != statusFail {
		t.Errorf("failed bool check: %q", c.Status)
	}
	if c := boolCheck("g", false, "consumer died"); c.Status != "FAIL: consumer died" {
		t.Errorf("bool check that could not run: %q", c.Status)
	}
}

func padGoal(g string) string { return g + strings.Repeat(" ", 62-len(g)) }

// Only PASS and "not measured here" leave the exit status 0.
func TestVerdict(t *testing.T) {
	pass, here := Check{Goal: "a", Status: statusPass}, notHere("b", "no --kvikio reader given")
	if err := verdict([]Check{pass, here, gpuOnly("c", true)}); err != nil {
		t.Fatalf("passes and targets not measured here: %v", err)
	}
	for _, bad := range []Check{
		{Goal: "rate", Status: statusMiss},
		boolCheck("bytes", false, ""),
		boolCheck("bytes", false, "sums: consumer died"),
		newCheck("zero figure", 0, 30, "GB/s", false, "gdsfs's staging failed"),
		gpuOnly("on no GPU", false),
		notChecked("case ran: gdsfs defaults", "cuFile is unavailable"),
	} {
		err := verdict([]Check{pass, here, bad})
		if err == nil || !strings.Contains(err.Error(), bad.Goal) {
			t.Errorf("%s (%s): verdict %v, want an error naming it", bad.Goal, bad.Status, err)
		}
	}
}

// stageStatuses is each check's status by goal.
func stageStatuses(f stageFigures) map[string]string {
	out := map[string]string{}
	for _, c := range stageChecks(f) {
		out[c.Goal] = c.Status
	}
	return out
}

func TestStageChecks(t *testing.T) {
	s16x8, s32x4 := kvikSetting{16, 8 << 20}, kvikSetting{32, 4 << 20}
	base := stageFigures{gpu: true, kvikAsked: true, defaults: 50, h2d: 55, kvik: kvikResult{Setting: s16x8, GBps: 50.2},
		rounds: []roundStat{{Round: 1, Defaults: 51, Kvik: 50.2, KvikSetting: s16x8, Ratio: 51 / 50.2},
			{Round: 2, Defaults: 48.5, Kvik: 49, KvikSetting: s32x4, Ratio: 48.5 / 49}}}
	const (
		round1  = "round 1: gdsfs defaults >= 1.0 x KvikIO best of the round (16 threads x 8 MiB)"
		round2  = "round 2: gdsfs defaults >= 1.0 x KvikIO best of the round (32 threads x 4 MiB)"
		every   = "gdsfs defaults >= 1.0 x KvikIO best, in every round"
		peers   = "gdsfs defaults >= 1.3 x best Python peer"
		noPeers = "not measured here: no Python peer asked for (--peers, no --quick)"
	)
	for _, tc := range []struct {
		name string
		edit func(*stageFigures)
		want map[string]string
	}{
		{"KvikIO wins round 2", func(*stageFigures) {}, map[string]string{
			round1: statusPass, round2: statusMiss, h2dGoal: statusMiss, peers: noPeers, coldGoal: "not measured here: no --cold"}},
		{"every round won, H2D met", func(f *stageFigures) { f.rounds[1].Ratio, f.defaults = 1.01, 50.7 }, map[string]string{
			round1: statusPass, round2: statusPass, h2dGoal: statusPass}},
		{"H2D just short of 0.92", func(f *stageFigures) { f.defaults = 0.919 * 55 }, map[string]string{h2dGoal: statusMiss}},
		{"no KvikIO run succeeded in a round", func(f *stageFigures) {
			f.rounds[1] = roundStat{Round: 2, Defaults: 48.5}
			f.kvikWhy = "no KvikIO run succeeded: exit 1"
		}, map[string]string{round1: statusPass,
			"round 2: gdsfs defaults >= 1.0 x KvikIO best of the round": "not checked: no KvikIO run of this round succeeded: no KvikIO run succeeded: exit 1"}},
		{"gdsfs's staging failed in a round", func(f *stageFigures) { f.rounds[1].Defaults, f.rounds[1].Ratio = 0, 0 }, map[string]string{
			round2: "not checked: gdsfs's staging failed in this round"}},
		{"KvikIO ran no round", func(f *stageFigures) { f.rounds, f.kvikWhy = nil, "no KvikIO run succeeded: exit 1" }, map[string]string{
			every: "not checked: no KvikIO run succeeded: exit 1"}},
		{"no --kvikio", func(f *stageFigures) { f.kvikAsked = false }, map[string]string{every: "not measured here: no --kvikio reader given"}},
		{"cold met by the better disk read", func(f *stageFigures) {
			f.coldAsked, f.defaultsCold, f.diskDirect, f.diskBuffered = true, 1.45, 1.2, 1.52
		}, map[string]string{coldGoal: statusPass}},
		{"cold short of the buffered read", func(f *stageFigures) {
			f.coldAsked, f.defaultsCold, f.diskDirect, f.diskBuffered = true, 1.4, 1.2, 1.52
		}, map[string]string{coldGoal: statusMiss}},
		{"cold short of the O_DIRECT read, buffered failed", func(f *stageFigures) {
			f.coldAsked, f.defaultsCold, f.diskDirect = true, 1.4, 1.52
		}, map[string]string{coldGoal: statusMiss}},
		{"cold asked, both disk reads failed", func(f *stageFigures) { f.coldAsked, f.defaultsCold = true, 1.4 }, map[string]string{
			coldGoal: "not checked: gdsfs's cold staging or both disk reads failed"}},
		{"peers asked, none measured", func(f *stageFigures) { f.peersAsked = true }, map[string]string{
			peers: "not checked: no Python peer measured"}},
		{"gdsfs's own staging failed", func(f *stageFigures) { f.defaults = 0 }, map[string]string{
			h2dGoal: "not checked: gdsfs's staging or the copy failed"}},
		{"host backend chosen", func(f *stageFigures) { f.gpu, f.hostChosen = false, true }, map[string]string{
			every: statusNotHere + whyHost, h2dGoal: statusNotHere + whyHost, peers: statusNotHere + whyHost}},
		{"host backend, no GPU found", func(f *stageFigures) { f.gpu = false }, map[string]string{
			every: statusNoCheck + whyNoGPU, h2dGoal: statusNoCheck + whyNoGPU, peers: statusNoCheck + whyNoGPU}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := base
			f.rounds = append([]roundStat(nil), base.rounds...)
			tc.edit(&f)
			got := stageStatuses(f)
			for goal, want := range tc.want {
				if got[goal] != want {
					t.Errorf("%q: %q, want %q (all: %v)", goal, got[goal], want, got)
				}
			}
		})
	}
}

func TestStageRowChecks(t *testing.T) {
	rows := []benchRow{{Name: "gdsfs defaults", Warm: 3}, {Name: "gdsfs cuFile path", Why: statusNotHere + whyHost},
		{Name: "gdsfs POSIX path", Why: "stage x: EIO"}}
	got := rowChecks(rows)
	if len(got) != 1 || got[0].Goal != "case ran: gdsfs POSIX path" || got[0].passes() {
		t.Fatalf("row checks %+v: want one failure, the POSIX row", got)
	}
}

// gdsfs's own staging failing fails the run, on the host backend too; the
// same run with a staging that works passes (its GPU targets are not
// measured here).
func TestStageVerdict(t *testing.T) {
	for _, tc := range []struct {
		sets []string
		ok   bool
	}{
		{[]string{"staging.device=host"}, true},
		{[]string{"staging.device=host", "io.compat_mode=off"}, false},
	} {
		cfg, err := StageConfig(tc.sets)
		if err != nil {
			t.Fatal(err)
		}
		err = Stage(context.Background(), cfg, StageOptions{Size: 1 << 20, Dir: t.TempDir(), Runs: 1, Rounds: 1, Quick: true})
		if (err == nil) != tc.ok {
			t.Errorf("%v: error %v, want ok=%v", tc.sets, err, tc.ok)
		}
		if !tc.ok && (err == nil || !strings.Contains(err.Error(), "case ran: gdsfs defaults")) {
			t.Errorf("%v: the error does not name gdsfs's staging: %v", tc.sets, err)
		}
	}
}

func TestLeaseChecks(t *testing.T) {
	r := leaseResult{Device: "GPU-1", Sizes: []string{"1MiB", "1GiB"}, Rows: []leaseRow{
		{Name: rowGoRepeat, Samples: 30, Median: map[string]float64{"1MiB": 0.2, "1GiB": 0.5}},
		{Name: rowPyRepeat, Samples: 10, Median: map[string]float64{"1MiB": 0.2, "1GiB": 0.2}},
		{Name: rowGoFirst, Samples: 30, Median: map[string]float64{"1MiB": 0.9, "1GiB": 0.9}},
		{Name: rowPyFirst, Why: "no torch"},
		{Name: rowFloor, Why: "floor.py did not start"},
	}}
	byGoal := map[string]string{}
	for _, c := range leaseChecks(r) {
		byGoal[c.Goal] = c.Status
	}
	for goal, want := range map[string]string{
		"Go repeat lease, 1MiB, median <= 0.3 ms":     statusPass,
		"Go repeat lease, 1GiB, median <= 0.3 ms":     statusMiss,
		"Python repeat lease, 1MiB, median <= 0.3 ms": "not checked: 10 samples, want at least 30",
		"Go first lease, 1GiB, median <= 1 ms":        statusPass,
		"Python first lease, 1MiB, median <= 1 ms":    "not checked: no torch",
		"case ran: " + rowFloor:                       "not checked: floor.py did not start",
	} {
		if byGoal[goal] != want {
			t.Errorf("%s: %q, want %q", goal, byGoal[goal], want)
		}
	}
	r.Device, r.HostChosen, r.Rows = "host", true, r.Rows[:3]
	for _, c := range leaseChecks(r) {
		if c.Status != statusNotHere+whyHost {
			t.Errorf("host backend chosen: %s is %q", c.Goal, c.Status)
		}
	}
	r.HostChosen = false
	if err := verdict(leaseChecks(r)); err == nil {
		t.Error("host backend where a GPU was meant: the run passes")
	}
	var buf bytes.Buffer
	r.Rows = append(r.Rows, leaseRow{Name: rowPyFirst, Why: "no torch"})
	writeLeaseText(&buf, &r)
	if !strings.Contains(buf.String(), "Python first lease: unavailable: no torch") {
		t.Errorf("text report does not say why a row is missing:\n%s", buf.String())
	}
}

func TestLoaderChecks(t *testing.T) {
	const (
		shardsBest = "leased epoch over 64 32.00 MiB files, best epoch >= 30 GB/s"
		smallBest  = "leased epoch over 1024 1.00 MiB files, best epoch >= 10 GB/s"
		smallFirst = "leased epoch over 1024 1.00 MiB files, first epoch >= 5 GB/s"
		smallBytes = "small: leased bytes sum as read() through the mount"
		big        = "gdsfs.load, 4.00 GiB file not resident >= 0.87 x pinned H2D"
		afterRead  = "cat, evict, gdsfs.load, 4.00 GiB file >= 0.85 x pinned H2D"
	)
	newResult := func() *loaderResult {
		return &loaderResult{Device: "GPU-1", Sets: map[string]*epochSet{
			"shards": {Files: 64, Bytes: 64 << 25, Lease: []float64{20, 31}, Read: []float64{5, 6}, SumsMatch: true},
			"small":  {Files: 1024, Bytes: 1 << 30, Lease: []float64{5.2, 10.4}, Read: []float64{1, 1}, SumsMatch: true},
		}, Big: &bigLoad{Bytes: 4 << 30, Load: []float64{40, 48.2}, AfterRead: []float64{35, 47.1}, H2D: []float64{55.36}}}
	}
	for _, tc := range []struct {
		name string
		edit func(*loaderResult)
		want map[string]string
	}{
		{"every target met", func(*loaderResult) {}, map[string]string{shardsBest: statusPass, smallBest: statusPass,
			smallFirst: statusPass, smallBytes: statusPass, big: statusPass, afterRead: statusPass}},
		{"small best met, first missed", func(r *loaderResult) { r.Sets["small"].Lease = []float64{1.94, 13} },
			map[string]string{smallBest: statusPass, smallFirst: statusMiss}},
		{"small first met, best missed", func(r *loaderResult) { r.Sets["small"].Lease = []float64{5, 4.38} },
			map[string]string{smallBest: statusMiss, smallFirst: statusPass}},
		{"loads just short of their ratios", func(r *loaderResult) {
			r.Big.Load, r.Big.AfterRead = []float64{0.869 * 55.36}, []float64{34.97}
		}, map[string]string{big: statusMiss, afterRead: statusMiss}},
		{"after a plain read failed", func(r *loaderResult) { r.Big.AfterRead, r.Big.AfterReadError = nil, "CalledProcessError: cat" },
			map[string]string{big: statusPass, afterRead: "not checked: CalledProcessError: cat"}},
		{"after a plain read not measured (older loader.py)", func(r *loaderResult) { r.Big.AfterRead = nil },
			map[string]string{afterRead: "not checked: loader.py measured no load after a plain read"}},
		{"no H2D figure", func(r *loaderResult) { r.Big.H2D, r.Big.H2DWhy = nil, "cuda: out of memory" },
			map[string]string{big: "not checked: cuda: out of memory", afterRead: "not checked: cuda: out of memory"}},
		{"bytes differ", func(r *loaderResult) { r.Sets["small"].SumsMatch = false }, map[string]string{smallBytes: statusFail}},
		{"epoch failed", func(r *loaderResult) { r.Sets["small"].Lease, r.Sets["small"].Error = nil, "loader.py: killed" },
			map[string]string{smallBest: "not checked: loader.py: killed", smallFirst: "not checked: loader.py: killed",
				smallBytes: "FAIL: loader.py: killed"}},
		{"host backend chosen", func(r *loaderResult) { r.Device, r.HostChosen = "host", true }, map[string]string{
			shardsBest: statusNotHere + whyHost, smallFirst: statusNotHere + whyHost, smallBytes: statusPass,
			big: statusNotHere + whyHost, afterRead: statusNotHere + whyHost}},
		{"host backend, no GPU found", func(r *loaderResult) { r.Device = "host" }, map[string]string{
			smallBest: statusNoCheck + whyNoGPU, afterRead: statusNoCheck + whyNoGPU}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newResult()
			tc.edit(r)
			got := map[string]string{}
			for _, c := range loaderChecks(r) {
				got[c.Goal] = c.Status
			}
			for goal, want := range tc.want {
				if got[goal] != want {
					t.Errorf("%q: %q, want %q (all: %v)", goal, got[goal], want, got)
				}
			}
		})
	}
	// A case asked for that measured nothing fails.
	r := newResult()
	r.Asked, r.Big = map[string]bool{"big": true}, nil
	if err := verdict(loaderChecks(r)); err == nil || !strings.Contains(err.Error(), "case ran: big") {
		t.Errorf("big load asked for, none measured: %v", err)
	}
}

func TestContentionChecks(t *testing.T) {
	r := &contentionResult{Acquired: 128, Before: procUsage{RSSBytes: 100 << 20, FDs: 20}, After: procUsage{RSSBytes: 120 << 20, FDs: 20}}
	if err := verdict(contentionChecks(r)); err != nil {
		t.Errorf("all good: %v", err)
	}
	r.Acquired, r.Failed, r.Mismatches, r.LeasesActive, r.After.FDs, r.After.RSSBytes = 52, 76, 1, 2, 21, 200<<20
	for _, c := range contentionChecks(r) {
		if c.passes() {
			t.Errorf("%s: %q passes", c.Goal, c.Status)
		}
	}
	// Wrong bytes alone, or leases left active alone, fail the run.
	for _, set := range []func(*contentionResult){
		func(r *contentionResult) { r.Mismatches = 1 },
		func(r *contentionResult) { r.LeasesActive = 1 },
	} {
		r := &contentionResult{Acquired: 128, Before: procUsage{RSSBytes: 100 << 20, FDs: 20}, After: procUsage{RSSBytes: 100 << 20, FDs: 20}}
		set(r)
		if err := verdict(contentionChecks(r)); err == nil {
			t.Errorf("%+v: the run passes", r)
		}
	}
}

func TestLastJSONLine(t *testing.T) {
	var v map[string]int
	if err := lastJSONLine([]byte("warning: x\n{\"a\": 1}\n{\"a\": 2}\nbye\n"), &v); err != nil || v["a"] != 2 {
		t.Fatalf("got %v, %v", v, err)
	}
	if err := lastJSONLine([]byte("Traceback\nError"), &v); err == nil {
		t.Fatal("no error without a JSON line")
	}
}

func TestAppendReport(t *testing.T) {
	p := filepath.Join(t.TempDir(), "r.jsonl")
	for i := range 2 {
		if err := appendReport(p, "lease", map[string]int{"n": i}); err != nil {
			t.Fatal(err)
		}
	}
	b, _ := os.ReadFile(p)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	var rec struct {
		Bench  string
		Result map[string]int
	}
	if len(lines) != 2 || json.Unmarshal([]byte(lines[1]), &rec) != nil || rec.Bench != "lease" || rec.Result["n"] != 1 {
		t.Fatalf("report file:\n%s", b)
	}
}

func TestPrintResult(t *testing.T) {
	p := filepath.Join(t.TempDir(), "r.jsonl")
	res := map[string]int{"n": 7}
	text := func(w io.Writer) { fmt.Fprintln(w, "n is 7") }
	for _, tc := range []struct {
		asJSON bool
		want   string
	}{{true, "{\"n\":7}\n"}, {false, "n is 7\n"}} {
		var out bytes.Buffer
		if err := printResult(&out, p, "stage", res, tc.asJSON, text); err != nil {
			t.Fatal(err)
		}
		if out.String() != tc.want {
			t.Errorf("JSON %v: printed %q, want %q", tc.asJSON, out.String(), tc.want)
		}
	}
	b, _ := os.ReadFile(p)
	if want := strings.Repeat("{\"bench\":\"stage\",\"result\":{\"n\":7}}\n", 2); string(b) != want {
		t.Errorf("report file %q, want %q", b, want)
	}
	if err := printResult(io.Discard, filepath.Join(t.TempDir(), "none", "r.jsonl"), "stage", res, true, text); err == nil {
		t.Error("a report file that cannot be made: no error")
	}
}

func TestIOSettingsNamesTheWorkers(t *testing.T) {
	cfg, err := config.Load("", []string{"io.num_threads=7"})
	if err != nil {
		t.Fatal(err)
	}
	if s := ioSettings(cfg); !strings.Contains(s, "num_threads=7") || !strings.Contains(s, "bounce_size=") {
		t.Fatalf("ioSettings %q", s)
	}
}

func TestScriptArgs(t *testing.T) {
	py := &pyEnv{Bin: "/usr/bin/python3"}
	got := strings.Join(scriptArgs(ScriptOptions{Name: "readahead", Quick: true}, py, true), " ")
	if got != "--python /usr/bin/python3 --device host --no-drop --dry-run --shards 64 --shard-mib 1" {
		t.Errorf("readahead on the host backend: %s", got)
	}
	if got := strings.Join(scriptArgs(ScriptOptions{Name: "readahead"}, py, false), " "); got != "--python /usr/bin/python3" {
		t.Errorf("readahead on a GPU: %s", got)
	}
	if got := strings.Join(scriptArgs(ScriptOptions{Name: "autoload", Quick: true}, py, false), " "); got != "--size-gib 1 --repeat 1" {
		t.Errorf("autoload --quick: %s", got)
	}
	// On the host backend autoload runs its dry run (work directory,
	// files, mount, warmup), unless --force.
	if got := strings.Join(scriptArgs(ScriptOptions{Name: "autoload"}, py, true), " "); got != "--dry-run" {
		t.Errorf("autoload on the host backend: %s", got)
	}
	if got := strings.Join(scriptArgs(ScriptOptions{Name: "autoload", Force: true}, py, true), " "); got != "" {
		t.Errorf("autoload --force on the host backend: %s", got)
	}
	// --set reaches the scripts' mounts, not only the choice of backend.
	sets := []string{"staging.device=host", "io.direct_io=off"}
	if got := strings.Join(scriptArgs(ScriptOptions{Name: "autoload", Sets: sets}, py, true), " "); got != "--dry-run --set staging.device=host --set io.direct_io=off" {
		t.Errorf("autoload --set: %s", got)
	}
	if got := strings.Join(scriptArgs(ScriptOptions{Name: "readahead", Sets: sets}, py, true), " "); got != "--python /usr/bin/python3 --device host --no-drop --dry-run --set staging.device=host --set io.direct_io=off" {
		t.Errorf("readahead --set: %s", got)
	}
}

// The embedded scripts are laid out as in the repository, so they find the
// gdsfs package (and autoload's fixtures) from where they are, and the
// modules they import beside them.
func TestWriteRepoScript(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Fatalf("python3 is needed to run the laid-out scripts: %v", err)
	}
	pkg := t.TempDir()
	root := filepath.Join(t.TempDir(), "repo")
	p, err := writeRepoScript(&pyEnv{Pkg: pkg}, root, benchScripts["readahead"])
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(p); !bytes.Equal(b, scripts.Readahead) || p != filepath.Join(root, "scripts", "readahead-gpu.py") {
		t.Errorf("script at %s differs from the embedded one", p)
	}
	if dst, err := os.Readlink(filepath.Join(root, "python")); err != nil || dst != pkg {
		t.Errorf("python link %q, %v; want %s", dst, err, pkg)
	}
	for _, name := range []string{"readahead", "autoload"} {
		p, err := writeRepoScript(&pyEnv{Pkg: pkg}, root, benchScripts[name])
		if err != nil {
			t.Fatalf("%s laid out over another: %v", name, err)
		}
		if out, err := exec.Command(py, p, "--help").CombinedOutput(); err != nil {
			t.Errorf("%s --help, laid out: %v\n%s", p, err, out)
		}
	}
}

// The Python helpers compile (python3 is in CI: the client's tests need it).
func TestHelpersCompile(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Fatalf("python3 is needed to check the helpers: %v", err)
	}
	dir := t.TempDir()
	for name, body := range map[string][]byte{"lease.py": leaseScript, "floor.py": floorScript, "loader.py": loaderScript,
		"contention.py": contentionScript, "peers.py": peersScript, "autoload.py": scripts.Autoload, "readahead.py": scripts.Readahead} {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, body, 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command(py, "-m", "py_compile", p).CombinedOutput(); err != nil {
			t.Errorf("%s: %v\n%s", name, err, out)
		}
	}
}

func TestFDKindsGrown(t *testing.T) {
	before := map[string]int{fdKind("socket:[1]"): 3, fdKind("/dev/nvidia0"): 2, fdKind("anon_inode:[eventfd]"): 1}
	after := map[string]int{fdKind("socket:[9]"): 4, fdKind("/dev/nvidia0"): 2, fdKind("anon_inode:[eventfd]"): 2, fdKind("pipe:[3]"): 1}
	if got, want := fdKindsGrown(before, after), "anon_inode:[eventfd] +1, pipe +1, socket +1"; got != want {
		t.Fatalf("grown %q, want %q", got, want)
	}
}

// On the host backend without staging.device=host (no GPU found), the
// GPU scripts fail instead of running their dry run.
func TestScriptNeedsAGPUUnlessHostChosen(t *testing.T) {
	host, err := hostBackend(nil)
	if err != nil {
		t.Fatal(err)
	}
	if !host {
		t.Skip("SKIPPED: this machine has a GPU: the case without one cannot be made here")
	}
	err = Script(context.Background(), ScriptOptions{Name: "readahead", Dir: t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), "no GPU") {
		t.Fatalf("readahead with no GPU and staging.device not host: %v", err)
	}
}
