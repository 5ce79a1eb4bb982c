package integration

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestBenchScriptsOutputDirOfAnotherUser: scripts/bench-gpu.sh and
// scripts/bench-ab.sh, run as root with their default output directories
// under /tmp, never write through a link another user left in such a
// directory made before them. Each runs in a mount namespace of its own
// with fresh /tmp and /var/tmp, so the defaults are used and nothing of
// the machine's is touched.
func TestBenchScriptsOutputDirOfAnotherUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("SKIPPED: needs root (a mount namespace, files of uid 65534)")
	}
	need(t, "unshare")
	for _, tc := range []struct{ name, out, log, cmd string }{
		{"bench-gpu.sh", "/tmp/gdsfs-bench-out", "bench-gpu.txt", "GDSFS_BENCH_STEPS=none sh scripts/bench-gpu.sh --dry-run"},
		{"bench-ab.sh", "/tmp/gdsfs-ab-out", "ab.txt", "GDSFS_AB_MODE=dry GDSFS_AB_ROUNDS=1 sh scripts/bench-ab.sh /bin/true /bin/true"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			script := strings.Join([]string{
				"set -e",
				"mount -t tmpfs tmpfs /tmp && mount -t tmpfs tmpfs /var/tmp",
				"echo root-only > /var/tmp/victim && chmod 600 /var/tmp/victim",
				"mkdir " + tc.out + " && ln -s /var/tmp/victim " + tc.out + "/" + tc.log,
				"chown -hR 65534:65534 " + tc.out,
				"set +e",
				"(cd .. && " + tc.cmd + ") >/dev/null 2>&1",
				"cat /var/tmp/victim",
			}, "\n")
			out, err := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c", script).CombinedOutput()
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			if string(out) != "root-only\n" {
				t.Errorf("%s rewrote root's file through uid %d's link %s/%s: it holds now %q", tc.name, nobody, tc.out, tc.log, firstLine(out))
			}
		})
	}
}

func firstLine(b []byte) string {
	s, _, _ := strings.Cut(string(b), "\n")
	return s
}
