package daemon

import (
	"errors"
	"fmt"
	"testing"
)

func TestExitCode(t *testing.T) {
	bad := errors.New("bad")
	for _, tc := range []struct {
		name string
		err  error
		want int
	}{
		{"nil", nil, 0},
		{"any error", bad, 1},
		{"usage", UsageError{bad}, 2},
		{"wrapped usage", fmt.Errorf("mount: %w", UsageError{bad}), 2},
		{"reported by a detached daemon", ReportedError{Err: bad, Code: 2}, 2},
		{"reported wins over usage", ReportedError{Err: UsageError{bad}, Code: 1}, 1},
	} {
		if got := ExitCode(tc.err); got != tc.want {
			t.Errorf("%s: ExitCode(%v) = %d, want %d", tc.name, tc.err, got, tc.want)
		}
	}
	if !errors.Is(UsageError{bad}, bad) || !errors.Is(ReportedError{Err: bad}, bad) {
		t.Error("UsageError and ReportedError do not unwrap to their error")
	}
}
