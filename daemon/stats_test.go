package daemon

import (
	"strings"
	"testing"
	"time"
)

func TestRateLine(t *testing.T) {
	prev := map[string]any{"opens": 10.0, "bytes_posix": 0.0, "resident_bytes": 1e6, "leases_active": 1.0}
	cur := map[string]any{"opens": 30.0, "bytes_posix": 4e8, "resident_bytes": 5e6, "leases_active": 2.0}
	line := rateLine(prev, cur, 2*time.Second, time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC))
	f := strings.Fields(line)
	h := strings.Fields(watchHeader)
	if len(f) != len(h) {
		t.Fatalf("%d fields under %d headings:\n%s\n%s", len(f), len(h), watchHeader, line)
	}
	got := map[string]string{}
	for i := range h {
		got[h[i]] = f[i]
	}
	for col, want := range map[string]string{"time": "12:00:00", "opens/s": "10.0", "posix_MB/s": "200.0",
		"hits/s": "0.0", "resident_MB": "5.0", "leases": "2.0"} {
		if got[col] != want {
			t.Errorf("%s = %s, want %s (%s)", col, got[col], want, line)
		}
	}
}

func TestStatsCuFileSection(t *testing.T) {
	m := map[string]any{
		"opens": float64(1),
		"cufile": map[string]any{
			"statistics": "level 3", "level": float64(3), "attribution": "mismatch gdsfs=4096 cufile=8192 on GPU-a",
			"read_bytes": float64(8192), "read_ops": float64(2), "read_errors": float64(0),
			"gpus": []any{map[string]any{"name": "GPU-a", "index": float64(0), "read_bytes": float64(8192),
				"reads": float64(2), "nvfs_reads": float64(0), "posix_reads": float64(2), "p2p_reads": float64(0),
				"read_errors": float64(0)}},
		},
	}
	got := string(formatStats(m))
	want := "\n[cufile]\nstatistics level 3\nattribution mismatch gdsfs=4096 cufile=8192 on GPU-a\nread_bytes 8192\n" +
		"read_ops 2\nread_errors 0\nGPU-a index=0,nvfs_reads=0,p2p_reads=0,posix_reads=2,read_bytes=8192,read_errors=0,reads=2\n"
	if !strings.Contains(got, want) || strings.Contains(got, "[other]") {
		t.Errorf("stats text:\n%s\nwant a section\n%s", got, want)
	}
}
