//go:build cgo

package cuda

import (
	_ "embed"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

const envFakeCuFile = "GDSFS_CUDA_TEST_FAKE_CUFILE"

//go:embed testdata/fakecufile.c
var fakeCuFileSource []byte

// fakeCuFile builds testdata/fakecufile.c into a shared library.
func fakeCuFile(t *testing.T, defines ...string) string {
	t.Helper()
	cc, err := exec.LookPath("cc")
	if err != nil {
		// The GPU machine runs this binary without a toolchain; every
		// machine that builds the package has one (cgo).
		t.Skipf("SKIPPED: no C compiler (cc) to build the fake libcufile: %v", err)
	}
	dir := t.TempDir()
	src, lib := filepath.Join(dir, "fakecufile.c"), filepath.Join(dir, "libcufile.so.0")
	if err := os.WriteFile(src, fakeCuFileSource, 0o644); err != nil {
		t.Fatal(err)
	}
	args := append([]string{"-shared", "-fPIC", "-o", lib}, defines...)
	if out, err := exec.Command(cc, append(args, src)...).CombinedOutput(); err != nil {
		t.Fatalf("cc: %v\n%s", err, out)
	}
	return lib
}

// statsFromChild loads lib as libcufile in a child process (the library
// is loaded once per process) and returns CuFileStatistics' answer there.
func statsFromChild(t *testing.T, lib, level string) (CuFileStats, string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestCuFileStatsChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), envFakeCuFile+"="+lib, "CUFILE_STATS_LEVEL="+level)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	var got struct {
		Stats  CuFileStats
		Why    string
		Closed string
	}
	for _, l := range strings.Split(string(out), "\n") {
		if s, ok := strings.CutPrefix(l, "STATS="); ok {
			if err := json.Unmarshal([]byte(s), &got); err != nil {
				t.Fatalf("child output %q: %v", s, err)
			}
			if got.Why == "" && got.Closed != "the cuFile driver is closed" {
				t.Errorf("statistics after the driver closed: %q", got.Closed)
			}
			return got.Stats, got.Why
		}
	}
	t.Fatalf("child printed no STATS= line:\n%s", out)
	return CuFileStats{}, ""
}

// TestCuFileStatsChild is the child side of the fake-library tests.
func TestCuFileStatsChild(t *testing.T) {
	lib := os.Getenv(envFakeCuFile)
	if lib == "" {
		t.Skip("helper run by TestCuFileStatsFakeLibrary in a child process")
	}
	cufileSearch = func() []string { return []string{lib} }
	if err := loadCuFileLib(); err != nil {
		t.Fatalf("load %s: %v", lib, err)
	}
	startCuFileStats()
	st, why := CuFileStatistics()
	stopCuFileStats()
	_, closed := CuFileStatistics()
	b, _ := json.Marshal(struct {
		Stats  CuFileStats
		Why    string
		Closed string
	}{st, why, closed})
	os.Stdout.Write(append(append([]byte("STATS="), b...), '\n'))
}

func TestCuFileStatsFakeLibrary(t *testing.T) {
	st, why := statsFromChild(t, fakeCuFile(t), "")
	if why != "" {
		t.Fatalf("statistics unavailable: %s", why)
	}
	want := CuFileStats{Level: 3, ReadBytes: 4<<30 + 40960, ReadOps: 1030, ReadErrors: 2, GPUs: []CuFileGPUStats{
		{Name: "GPU-a0a1a2a3-a4a5-a6a7-a8a9-aaabacadaeaf", Index: 0, ReadBytes: 4 << 30, Reads: 1024, PosixReads: 1024, ReadErrors: 2},
		{Name: "gpu1", Index: 1, ReadBytes: 40960, Reads: 10, NvfsReads: 6, P2PReads: 4},
	}}
	gb, _ := json.Marshal(st)
	wb, _ := json.Marshal(want)
	if string(gb) != string(wb) {
		t.Fatalf("stats\n got %s\nwant %s", gb, wb)
	}
	gpu0 := StagedBytes{Name: want.GPUs[0].Name, BytesCuFile: 4 << 30}
	if got := Attribute("compat", []StagedBytes{gpu0}, st); !strings.HasPrefix(got, "mismatch gdsfs=0 cufile=40960 on gpu1 (not a staging device)") {
		t.Errorf("cuFile reads on a GPU gdsfs does not stage on: %q", got)
	}
	// GPU 1 (no UUID in cuFile's counters) is matched by ordinal.
	gpu1 := StagedBytes{Name: "GPU-11111111-2222-3333-4444-555555555555", Ordinal: 1, BytesCuFile: 40960}
	if got := Attribute("compat", []StagedBytes{gpu0}, CuFileStats{Level: 3, GPUs: st.GPUs[:1]}); got != "ok" {
		t.Errorf("matching bytes, POSIX reads in compat mode: %q, want ok", got)
	}
	if got := Attribute("gds", []StagedBytes{gpu1}, CuFileStats{Level: 3, GPUs: st.GPUs[1:]}); got != "ok" {
		t.Errorf("matching bytes, nvidia-fs reads in gds mode: %q, want ok", got)
	}
	gpu0.BytesCuFile = 4<<30 - 4096
	if got := Attribute("compat", []StagedBytes{gpu0, gpu1}, st); got !=
		"mismatch gdsfs=4294963200 cufile=4294967296 on "+gpu0.Name+"; "+gpu1.Name+": cuFile read 10 times by nvidia-fs or P2PDMA in compat mode" {
		t.Errorf("mismatch: %q", got)
	}
}

func TestCuFileStatsLevels(t *testing.T) {
	lib := fakeCuFile(t)
	st, why := statsFromChild(t, lib, "1")
	if why != "" || st.Level != 1 || st.ReadBytes != 4<<30+40960 || len(st.GPUs) != 0 {
		t.Fatalf("level 1: %+v, %q", st, why)
	}
	staged := []StagedBytes{{Name: "GPU-a", BytesCuFile: 4 << 30}, {Name: "GPU-b", Ordinal: 1, BytesCuFile: 40960}}
	if got := Attribute("compat", staged, st); got != "ok (totals only: level 1 has no per-GPU counters)" {
		t.Errorf("level 1 totals: %q", got)
	}
	for _, bad := range []string{"0", "4", "x"} {
		if _, why := statsFromChild(t, lib, bad); !strings.Contains(why, "CUFILE_STATS_LEVEL=") {
			t.Errorf("CUFILE_STATS_LEVEL=%s: why %q does not name the variable", bad, why)
		}
	}
}

func TestCuFileStatsMissingSymbols(t *testing.T) {
	st, why := statsFromChild(t, fakeCuFile(t, "-DNO_STATS"), "")
	if why != "libcufile.so.0 has no cuFileSetStatsLevel" || st.Level != 0 {
		t.Fatalf("library without the statistics API: %+v, why %q", st, why)
	}
}

func TestAttributePending(t *testing.T) {
	st := CuFileStats{Level: 3, GPUs: []CuFileGPUStats{{Name: "GPU-a", ReadBytes: 8192, PosixReads: 2}}}
	busy := []StagedBytes{{Name: "GPU-a", BytesCuFile: 4096, Loading: 1}}
	if got := Attribute("compat", busy, st); got != "pending: 1 loads in progress (gdsfs=4096 cufile=8192 on GPU-a)" {
		t.Errorf("cuFile ahead while a load runs: %q", got)
	}
	// cuFile's GPU names that match no device are matched by ordinal.
	if got := Attribute("compat", []StagedBytes{{Name: "GPU-b", BytesCuFile: 8192}}, st); got != "ok" {
		t.Errorf("a GPU matched by ordinal: %q", got)
	}
	busy[0].BytesCuFile = 12288 // gdsfs counted more than cuFile read: never pending
	if got := Attribute("compat", busy, st); !strings.HasPrefix(got, "mismatch ") {
		t.Errorf("gdsfs ahead of cuFile: %q, want mismatch", got)
	}
	if got := Attribute("gds", []StagedBytes{{Name: "GPU-a", BytesCuFile: 8192}}, st); got != "mismatch GPU-a: cuFile read 2 times through POSIX in gds mode" {
		t.Errorf("POSIX reads in gds mode: %q", got)
	}
}

func TestReadPath(t *testing.T) {
	before := CuFileStats{Level: 3, GPUs: []CuFileGPUStats{{Name: "GPU-a", PosixReads: 5, NvfsReads: 1}}}
	for _, tc := range []struct {
		after CuFileGPUStats
		want  string
	}{
		{CuFileGPUStats{Name: "GPU-a", PosixReads: 6, NvfsReads: 1}, "compat (posix)"},
		{CuFileGPUStats{Name: "GPU-a", PosixReads: 5, NvfsReads: 3}, "gds"},
		{CuFileGPUStats{Name: "GPU-a", PosixReads: 5, NvfsReads: 1, P2PReads: 1}, "gds"},
		{CuFileGPUStats{Name: "GPU-a", PosixReads: 7, NvfsReads: 2}, "gds+compat (posix)"},
		{CuFileGPUStats{Name: "GPU-a", PosixReads: 5, NvfsReads: 1}, "none"},
	} {
		after := CuFileStats{Level: 3, GPUs: []CuFileGPUStats{tc.after}}
		if got := ReadPath(before, after, "GPU-a", 0); got != tc.want {
			t.Errorf("ReadPath to %+v = %q, want %q", tc.after, got, tc.want)
		}
	}
}
