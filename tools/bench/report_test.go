package bench

import (
	"bytes"
	"context"
	"encoding/json"
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

func TestStageChecks(t *testing.T) {
	f := stageFigures{gpu: true, defaults: 50, h2d: 54, kvik: kvikResult{Setting: kvikSetting{16, 4 << 20}, GBps: 46}, kvikAsked: true}
	got := stageChecks(f)
	want := []string{statusMiss, statusPass, "not measured here: no Python peer asked for (--peers, no --quick)",
		"not measured here: cold and disk both needed (--cold, no --quick)"}
	for i, w := range want {
		if got[i].Status != w {
			t.Errorf("check %q: %q, want %q", got[i].Goal, got[i].Status, w)
		}
	}
	if !strings.Contains(got[0].Goal, "16 threads x 4 MiB") {
		t.Errorf("KvikIO goal does not name its best setting: %q", got[0].Goal)
	}
	// Baselines asked for that gave no figure fail; not asked for, they
	// are not measured here.
	f.kvik, f.kvikWhy = kvikResult{}, "no KvikIO run succeeded: exit 1"
	f.peersAsked, f.coldAsked = true, true
	got = stageChecks(f)
	for i, w := range []string{"not checked: no KvikIO run succeeded: exit 1", statusPass, "not checked: no Python peer measured",
		"not checked: gdsfs's cold staging or the disk read failed"} {
		if got[i].Status != w {
			t.Errorf("asked for, no figure: %q is %q, want %q", got[i].Goal, got[i].Status, w)
		}
	}
	f.kvikAsked = false
	if s := stageChecks(f)[0].Status; s != "not measured here: no --kvikio reader given" {
		t.Errorf("without --kvikio: %q", s)
	}
	// gdsfs's own staging failed: the H2D target is not checked.
	f.defaults = 0
	if s := stageChecks(f)[1].Status; !strings.HasPrefix(s, statusNoCheck) {
		t.Errorf("gdsfs defaults failed on a GPU: %q", s)
	}
	f.gpu, f.hostChosen = false, true
	for _, c := range stageChecks(f)[:3] {
		if c.Status != statusNotHere+whyHost {
			t.Errorf("host backend chosen: %q is %q", c.Goal, c.Status)
		}
	}
	f.hostChosen = false
	for _, c := range stageChecks(f)[:3] {
		if c.passes() {
			t.Errorf("host backend where a GPU was meant: %q is %q", c.Goal, c.Status)
		}
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
	r := &loaderResult{Device: "GPU-1", Sets: map[string]*epochSet{
		"shards": {Files: 64, Bytes: 64 << 25, Lease: []float64{20, 31}, Read: []float64{5, 6}, SumsMatch: true},
		"small":  {Files: 1024, Bytes: 1 << 30, Lease: []float64{2, 3}, Read: []float64{1, 1}, SumsMatch: false},
	}, Big: &bigLoad{Bytes: 4 << 30, Load: []float64{40, 47}, H2D: []float64{55}}}
	want := []string{statusPass, statusPass, statusMiss, statusFail, statusPass}
	got := loaderChecks(r)
	if len(got) != len(want) {
		t.Fatalf("%d checks, want %d: %+v", len(got), len(want), got)
	}
	for i, w := range want {
		if got[i].Status != w {
			t.Errorf("%s: %q, want %q", got[i].Goal, got[i].Status, w)
		}
	}
	// A bytes check that could not be made fails.
	r.Sets["small"].Error = "loader.py: killed"
	if c := loaderChecks(r)[3]; c.passes() || c.Status != "FAIL: loader.py: killed" {
		t.Errorf("bytes check with an error: %q", c.Status)
	}
	r.Sets["small"].Error = ""
	r.Device, r.HostChosen = "host", true
	got = loaderChecks(r)
	if got[0].Status != statusNotHere+whyHost || got[1].Status != statusPass || got[4].Status != statusNotHere+whyHost {
		t.Errorf("host backend: rates not measured here, bytes still checked: %+v", got)
	}
	// A case asked for that measured nothing fails.
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
// gdsfs package (and autoload's fixtures) from where they are.
func TestWriteRepoScript(t *testing.T) {
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
	if _, err := writeRepoScript(&pyEnv{Pkg: pkg}, root, benchScripts["readahead"]); err != nil {
		t.Errorf("second layout over the first: %v", err)
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
