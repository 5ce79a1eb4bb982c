package main

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
