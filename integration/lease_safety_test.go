package integration

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// TestGoClientRefusesNestedMount: a file on a tmpfs mounted inside the
// gdsfs mount is not a gdsfs file, even though SOURCE has a file of the
// same name: the Go client stops at the nearest mount, as Python's does.
func TestGoClientRefusesNestedMount(t *testing.T) {
	src := sourceTree(t)
	m := startMount(t, src)
	inner := m.path("data")
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=1M", "gdsfs-test", inner).CombinedOutput(); err != nil {
		t.Fatalf("mount tmpfs on %s: %v %s", inner, err, out)
	}
	t.Cleanup(func() { syscall.Unmount(inner, syscall.MNT_DETACH) })
	os.WriteFile(filepath.Join(inner, "fc.bin"), []byte("the tmpfs's file"), 0o644)
	out, err := exec.Command(bins.leasecheck, filepath.Join(inner, "fc.bin")).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "not under a gdsfs mount") || !strings.Contains(string(out), "tmpfs") {
		t.Fatalf("leasing a file on a tmpfs inside the mount: %v\n%s\nwant a refusal naming the tmpfs", err, out)
	}
	if !strings.HasPrefix(string(out), "ENODEV") {
		t.Fatalf("errno: %s, want ENODEV", out)
	}
}

// TestSharedLeaseWriteFaults: a consumer writing through a shared lease
// faults, in that process only, and the next lease has the file's bytes.
func TestSharedLeaseWriteFaults(t *testing.T) {
	src := sourceTree(t)
	m := startMount(t, src)
	p := m.path("data/fe.bin")
	out, err := exec.Command(bins.leasecheck, "-write", p).Output()
	var ee *exec.ExitError
	if err == nil || !errorsAs(err, &ee) || ee.ExitCode() != 7 || !strings.Contains(string(out), "faulted") {
		t.Fatalf("writing through a shared lease: %v\n%s\nwant a fault (exit 7)", err, out)
	}
	r := leaseSum(t, p)
	if r["sha256"] != sha(t, filepath.Join(src, "data/fe.bin")) || r["readonly"] != true {
		t.Fatalf("the next lease: %v", r)
	}
}

// TestPrivateLeaseWritable: a private lease is the consumer's own copy:
// writing it works and the next lease still has the file's bytes.
func TestPrivateLeaseWritable(t *testing.T) {
	src := sourceTree(t)
	m := startMount(t, src, "ipc.sharing=private")
	p := m.path("data/fe.bin")
	out, err := exec.Command(bins.leasecheck, "-write", p).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "written") {
		t.Fatalf("writing a private lease: %v\n%s", err, out)
	}
	if r := leaseSum(t, p); r["sha256"] != sha(t, filepath.Join(src, "data/fe.bin")) || r["readonly"] != false {
		t.Fatalf("the next lease: %v", r)
	}
}

// TestTruncatedDescriptorsEndTheLease: when the kernel drops an answer's
// descriptors (MSG_CTRUNC: no room under RLIMIT_NOFILE), the Go client
// reports EMFILE and the daemon no longer holds the lease, while the
// consumer still runs.
func TestTruncatedDescriptorsEndTheLease(t *testing.T) {
	src := sourceTree(t)
	m := startMount(t, src, "staging.chunk_size=1MiB")
	cmd := exec.Command(bins.leasecheck, "-hold", "-nofile", "2", m.path("data/fg.bin")) // nine chunks, room for one
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	stderr := &syncBuffer{} // written by the process's copier goroutine
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line, _ := bufio.NewReader(stdout).ReadString('\n')
	if line != "failed EMFILE\n" {
		stdin.Close()
		cmd.Wait()
		t.Fatalf("leasecheck: %q, want failed EMFILE\n%s", line, stderr.String())
	}
	waitStat(t, m, "leases_active", 0)
	waitStat(t, m, "lease_held_bytes", 0)
	stdin.Close()
	cmd.Wait() // and its stderr copied
	if !strings.Contains(stderr.String(), "MSG_CTRUNC") {
		t.Errorf("the error does not say why: %s", stderr.String())
	}
}

// TestLeaseCyclesDoNotLeak: 10,000 lease cycles (repeat leases, and a
// file that changes every 100) leave the consumer with the descriptors and
// mappings it started with, and the daemon with none held.
func TestLeaseCyclesDoNotLeak(t *testing.T) {
	src := sourceTree(t)
	m := startMount(t, src, "staging.chunk_size=64KiB")
	// The daemon's descriptors other than staged regions' memfds (how
	// many regions stay resident is the cache's business: the change to
	// x.txt every 100 cycles replaces its region); the memfds are checked
	// against the cache's own count below.
	dir := fmt.Sprintf("/proc/%d/fd", m.cmd.Process.Pid)
	daemonFDs := func() (other, memfds int) {
		ents, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ents {
			if l, err := os.Readlink(filepath.Join(dir, e.Name())); err == nil && strings.HasPrefix(l, "/memfd:gdsfs") {
				memfds++
			} else {
				other++
			}
		}
		return other, memfds
	}
	paths := []string{m.path("data/fb.bin"), m.path("data/fe.bin"), m.path("deep/er/still/x.txt")}
	leaseSum(t, paths[0]) // stage, so the daemon's own descriptors settle
	leaseSum(t, paths[1])
	leaseSum(t, paths[2])
	waitStat(t, m, "ipc_open_connections", 0)
	before, _ := daemonFDs()
	out, err := exec.Command(bins.leasecheck, append([]string{"-cycles", "10000", "-change", filepath.Join(src, "deep/er/still/x.txt")}, paths...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("leasecheck -cycles: %v\n%s", err, out)
	}
	var c map[string]map[string]int
	if err := json.Unmarshal(out, &c); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if c["before"]["fds"] != c["after"]["fds"] || c["before"]["memfds"] != c["after"]["memfds"] ||
		c["before"]["memfd_maps"] != c["after"]["memfd_maps"] || c["after"]["memfds"] != 0 || c["after"]["memfd_maps"] != 0 {
		t.Fatalf("the consumer's descriptors and mappings changed over 10,000 cycles: %v", c)
	}
	waitStat(t, m, "ipc_open_connections", 0)
	waitStat(t, m, "lease_held_bytes", 0)
	waitStat(t, m, "leases_active", 0)
	s := statsOf(t, m)
	if after, memfds := daemonFDs(); after != before || float64(memfds) != s["descriptors_used"].(float64) {
		t.Fatalf("the daemon's descriptors: %d before the cycles, %d after; %d memfds held, the cache counts %v",
			before, after, memfds, s["descriptors_used"])
	}
	if s["leases_total"].(float64) < 10000 {
		t.Fatalf("leases_total %v", s["leases_total"])
	}
}

func errorsAs(err error, target **exec.ExitError) bool {
	e, ok := err.(*exec.ExitError)
	if ok {
		*target = e
	}
	return ok
}

var _ = strconv.Itoa
