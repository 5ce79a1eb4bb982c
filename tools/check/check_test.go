package check

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/gdsfs/gdsfs/gpu/cuda"
)

// The report on this machine: the verdict line first with its four
// fields, every field filled, each load error said once, JSON with the
// same fields and no nulls.
func TestReport(t *testing.T) {
	r := Run(t.TempDir())
	var text strings.Builder
	if err := r.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	out := text.String()
	first, _, _ := strings.Cut(out, "\n")
	for i, prefix := range []string{"GDS: ", "; cuFile compat: ", "; cuFile read path: ", "; POSIX path: ", "; staging device: "} {
		if !strings.Contains(first, prefix) || (i == 0 && !strings.HasPrefix(first, prefix)) {
			t.Fatalf("verdict line %q lacks %q", first, prefix)
		}
	}
	if !strings.Contains(r.POSIXPath, "works") {
		t.Errorf("POSIX path on this machine: %q", r.POSIXPath)
	}
	for _, lib := range []string{"libcuda.so.1: cannot open", "libcufile.so.0: cannot open"} {
		if n := strings.Count(out, lib); n > 1 {
			t.Errorf("%q said %d times:\n%s", lib, n, out)
		}
	}
	checkFilled(t, reflect.ValueOf(*r), "report")
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), "null") || strings.Contains(string(b), `""`) {
		t.Errorf("JSON has a null or empty field: %s", b)
	}
	var back Report
	if err := json.Unmarshal(b, &back); err != nil || !reflect.DeepEqual(back, *r) {
		t.Errorf("JSON does not carry the same content: %v", err)
	}
	if len(r.Advice) == 0 {
		t.Error("no advice")
	}
}

// checkFilled fails for any empty string field.
func checkFilled(t *testing.T, v reflect.Value, path string) {
	t.Helper()
	switch v.Kind() {
	case reflect.String:
		if v.String() == "" {
			t.Errorf("%s is empty", path)
		}
	case reflect.Struct:
		for i := range v.NumField() {
			checkFilled(t, v.Field(i), path+"."+v.Type().Field(i).Name)
		}
	case reflect.Slice:
		if v.IsNil() {
			t.Errorf("%s is nil", path)
		}
		for i := range v.Len() {
			checkFilled(t, v.Index(i), path)
		}
	}
}

func TestPassthroughSupport(t *testing.T) {
	for _, tc := range []struct {
		kernel string
		root   bool
		want   string
	}{
		{"6.8.0-45-generic", true, "no: kernel 6.8.0-45-generic < 6.9"},
		{"6.9.1", false, "no: needs root (CAP_SYS_ADMIN)"},
		{"6.18.44-fc", true, "yes (kernel >= 6.9, root)"},
		{"weird", true, "unknown (kernel version weird not understood)"},
	} {
		if got := passthroughSupport(tc.kernel, tc.root); got != tc.want {
			t.Errorf("passthroughSupport(%q, %v) = %q, want %q", tc.kernel, tc.root, got, tc.want)
		}
	}
}

// The topology section: each pair's peer access (and, without it, that
// replicas are staged from host) and link, from the CUDA report.
func TestTopology(t *testing.T) {
	cr := cuda.Report{Peers: []cuda.PeerReport{
		{A: 0, B: 1, AtoB: true, BtoA: true, Link: "NV18 through NVSwitch"},
		{A: 0, B: 2, AtoB: true, BtoA: false, Link: "PCIe or unknown (NVML finds no NVLink between them)"},
	}}
	got := topology(cr)
	if len(got) != 2 || got[0].PeerAccess != "yes" || got[0].Link != "NV18 through NVSwitch" {
		t.Fatalf("%+v", got)
	}
	if !strings.HasPrefix(got[1].PeerAccess, "no") || !strings.Contains(got[1].PeerAccess, "staged from host") {
		t.Errorf("a pair without access both ways: %+v", got[1])
	}
	r := &Report{Topology: got}
	var b strings.Builder
	r.WriteText(&b)
	if !strings.Contains(b.String(), "gpu0-gpu1") || !strings.Contains(b.String(), "link NV18 through NVSwitch") {
		t.Errorf("text:\n%s", b.String())
	}
	if topology(cuda.Report{}) == nil {
		t.Error("no pairs must be an empty list, not null")
	}
}

// The cuFile read path verdict comes from cuFile's counters around the
// probe's read.
func TestReadPathVerdict(t *testing.T) {
	before := cuda.CuFileStats{Level: 3, GPUs: []cuda.CuFileGPUStats{{Name: "GPU-a", PosixReads: 3}}}
	posix := cuda.CuFileStats{Level: 3, GPUs: []cuda.CuFileGPUStats{{Name: "GPU-a", PosixReads: 5, ReadBytes: 8 << 20}}}
	nvfs := cuda.CuFileStats{Level: 3, GPUs: []cuda.CuFileGPUStats{{Name: "GPU-a", PosixReads: 3, NvfsReads: 2}}}
	for _, tc := range []struct {
		after cuda.CuFileStats
		why   string
		want  string
	}{
		{posix, "", "compat (posix)"},
		{nvfs, "", "gds"},
		{before, "", "none (cuFile counted no read on GPU-a)"},
		{cuda.CuFileStats{Level: 1}, "", "unknown (cuFile statistics level 1 has no per-GPU counters; 3 does)"},
		{posix, "libcufile.so.0 has no cuFileGetStatsL3", "unknown (cuFile statistics unavailable: libcufile.so.0 has no cuFileGetStatsL3)"},
	} {
		if got := readPath(before, tc.after, tc.why, "GPU-a", 0); got != tc.want {
			t.Errorf("readPath(%+v, %q) = %q, want %q", tc.after, tc.why, got, tc.want)
		}
	}
}
