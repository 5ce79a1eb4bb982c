package bench

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gdsfs/gdsfs/internal/config"
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
	if c := hostCheck("g"); !strings.HasSuffix(c.String(), "n/a (host backend)") {
		t.Errorf("host check %q", c.String())
	}
	if c := boolCheck("g", true, ""); c.String() != "target  "+padGoal("g")+" PASS" {
		t.Errorf("bool check %q", c.String())
	}
	if c := boolCheck("g", false, "consumer died"); c.Status != "not checked: consumer died" {
		t.Errorf("bool check that could not run: %q", c.Status)
	}
}

func padGoal(g string) string { return g + strings.Repeat(" ", 62-len(g)) }

func TestStageChecks(t *testing.T) {
	f := stageFigures{gpu: true, defaults: 50, h2d: 54, kvik: kvikResult{Setting: kvikSetting{16, 4 << 20}, GBps: 46}}
	got := stageChecks(f)
	want := []string{statusMiss, statusPass, "not checked: no Python peer measured (--peers, no --quick)",
		"not checked: cold and disk both needed (--cold, no --quick)"}
	for i, w := range want {
		if got[i].Status != w {
			t.Errorf("check %q: %q, want %q", got[i].Goal, got[i].Status, w)
		}
	}
	if !strings.Contains(got[0].Goal, "16 threads x 4 MiB") {
		t.Errorf("KvikIO goal does not name its best setting: %q", got[0].Goal)
	}
	f.kvik, f.kvikWhy = kvikResult{}, "no --kvikio reader given"
	if s := stageChecks(f)[0].Status; s != "not checked: no --kvikio reader given" {
		t.Errorf("without KvikIO: %q", s)
	}
	f.gpu = false
	for _, c := range stageChecks(f)[:3] {
		if c.Status != statusHost {
			t.Errorf("host backend: %q is %q", c.Goal, c.Status)
		}
	}
}

func TestLeaseChecks(t *testing.T) {
	r := leaseResult{Device: "GPU-1", Sizes: []string{"1MiB", "1GiB"}, Rows: []leaseRow{
		{Name: rowGoRepeat, Samples: 30, Median: map[string]float64{"1MiB": 0.2, "1GiB": 0.5}},
		{Name: rowPyRepeat, Samples: 10, Median: map[string]float64{"1MiB": 0.2, "1GiB": 0.2}},
		{Name: rowGoFirst, Samples: 30, Median: map[string]float64{"1MiB": 0.9, "1GiB": 0.9}},
		{Name: rowPyFirst, Why: "no torch"},
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
	} {
		if byGoal[goal] != want {
			t.Errorf("%s: %q, want %q", goal, byGoal[goal], want)
		}
	}
	r.Device = "host"
	for _, c := range leaseChecks(r) {
		if c.Status != statusHost {
			t.Errorf("host backend: %s is %q", c.Goal, c.Status)
		}
	}
	var buf bytes.Buffer
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
	want := []string{statusPass, statusPass, statusMiss, statusMiss, statusPass}
	got := loaderChecks(r)
	if len(got) != len(want) {
		t.Fatalf("%d checks, want %d: %+v", len(got), len(want), got)
	}
	for i, w := range want {
		if got[i].Status != w {
			t.Errorf("%s: %q, want %q", got[i].Goal, got[i].Status, w)
		}
	}
	r.Device = "host"
	got = loaderChecks(r)
	if got[0].Status != statusHost || got[1].Status != statusPass || got[4].Status != statusHost {
		t.Errorf("host backend: rates n/a, bytes still checked: %+v", got)
	}
}

func TestContentionChecks(t *testing.T) {
	r := &contentionResult{Acquired: 128, Before: procUsage{RSSBytes: 100 << 20, FDs: 20}, After: procUsage{RSSBytes: 120 << 20, FDs: 20}}
	for _, c := range contentionChecks(r) {
		if c.Status != statusPass {
			t.Errorf("%s: %q", c.Goal, c.Status)
		}
	}
	r.Acquired, r.Failed, r.Mismatches, r.LeasesActive, r.After.FDs, r.After.RSSBytes = 52, 76, 1, 2, 21, 200<<20
	for _, c := range contentionChecks(r) {
		if c.Status != statusMiss {
			t.Errorf("%s: %q, want MISS", c.Goal, c.Status)
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
