package integration

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestWarmupWait: gdsfs warmup --wait returns once the daemon says each
// file is staged, and names a file that could not be (here: the whole
// capacity is held by leases, so its staging fails before it starts)
// without waiting out --timeout.
func TestWarmupWait(t *testing.T) {
	src := t.TempDir()
	for _, n := range []string{"a", "b", "c"} {
		randomFile(t, filepath.Join(src, "d", n), 1<<20, int(n[0]))
	}
	m := startMount(t, src, "staging.capacity=2MiB", "staging.prefetch=manual")
	out, err := exec.Command(bins.gdsfs, "warmup", "--wait", m.path("d/a"), m.path("d/b")).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "2 files resident") {
		t.Fatalf("warmup --wait: %v\n%s", err, out)
	}
	for _, n := range []string{"d/a", "d/b"} {
		if got := xattr(t, m.path(n), "state"); got != "resident" {
			t.Fatalf("%s is %q after warmup --wait returned", n, got)
		}
	}
	hold(t, m.path("d/a"), m.path("d/b")) // the whole capacity, held
	out, err = exec.Command(bins.gdsfs, "warmup", "--wait", "--timeout", "10m", m.path("d/c")).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "1 of 1 files not staged: d/c: absent") {
		t.Fatalf("warmup --wait of a file there is no room for: %v\n%s", err, out)
	}
}
