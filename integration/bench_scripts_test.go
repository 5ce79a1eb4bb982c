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
				"cd -P .. && test -f scripts/" + tc.name, // the physical path: a logical one under /tmp is gone now
				"set +e",
				"(" + tc.cmd + ") >/dev/null 2>&1",
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

// TestBenchGPUKvikbenchOfAnotherUser: scripts/bench-gpu.sh, run as root,
// hands the stage step no KvikIO reader but one it built: where its build
// fails, a /tmp/kvikbench another user left is not run as root. In a
// mount namespace with fresh /tmp and /var/tmp; the gdsfs binary is a
// stand-in that records its arguments, nvidia-smi one that names a GPU.
func TestBenchGPUKvikbenchOfAnotherUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("SKIPPED: needs root (a mount namespace, files of uid 65534)")
	}
	need(t, "unshare")
	script := strings.Join([]string{
		"set -e",
		"mount -t tmpfs tmpfs /tmp && mount -t tmpfs tmpfs /var/tmp",
		"mkdir -p /tmp/repo/scripts /tmp/repo/.bin /tmp/fake /tmp/kv",
		"cp ../scripts/bench-gpu.sh ../scripts/outdir.sh ../scripts/step-verdict.py /tmp/repo/scripts/",
		`printf '#!/bin/sh\necho "$*" >> /tmp/gdsfs-args\n' > /tmp/repo/.bin/gdsfs`,
		`printf '#!/bin/sh\necho "GPU 0: stand-in"\n' > /tmp/fake/nvidia-smi`,
		`printf 'echo no CUDA 13.0 here; exit 1\n' > /tmp/kv/build.sh`,
		`printf '#!/bin/sh\nid -u > /tmp/kvikbench-ran\n' > /tmp/kvikbench`,
		"chmod 755 /tmp/repo/.bin/gdsfs /tmp/fake/nvidia-smi /tmp/kvikbench",
		"chown 65534:65534 /tmp/kvikbench",
		"set +e",
		"PATH=/tmp/fake:$PATH KVIKIO_SRC=/tmp/kv GDSFS_BENCH_STEPS=stage sh /tmp/repo/scripts/bench-gpu.sh >/dev/null 2>&1",
		"cat /tmp/gdsfs-args",
	}, "\n")
	out, err := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c", script).CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var stage string
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(l, "bench stage ") {
			stage = l
		}
	}
	switch {
	case stage == "":
		t.Fatalf("bench-gpu.sh ran no stage step; the stand-in gdsfs got:\n%s", out)
	case strings.Contains(stage, "--kvikio /tmp/kvikbench"):
		t.Errorf("bench-gpu.sh, its kvikbench build failed, ran the stage step with uid %d's /tmp/kvikbench as root's KvikIO reader: %s", nobody, stage)
	}
}

func firstLine(b []byte) string {
	s, _, _ := strings.Cut(string(b), "\n")
	return s
}
