package integration

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// A mount staging onto two host devices (staging.host_devices: the CI
// stand-in for two GPUs): warmup --gpus stages a replica on each, reading
// the file once; a consumer naming its device gets the replica there; a
// killed consumer frees only its own leases; evicting one replica leaves
// the other served.
func TestReplicasOnHostDevices(t *testing.T) {
	src := t.TempDir()
	const size = 3<<20 + 77
	randomFile(t, filepath.Join(src, "w.bin"), size, 12)
	want := fileSum(t, filepath.Join(src, "w.bin"))
	m := startMount(t, src, "staging.device=host", "staging.host_devices=2", "staging.capacity=64MiB",
		"staging.prefetch=manual", "io.task_size=256KiB", "staging.racy_window=0s")
	p := m.path("w.bin")
	sh(t, fmt.Sprintf("%s warmup --wait --gpus all %s", bins.gdsfs, p))
	st := statsOf(t, m)
	if st["split_loads"].(float64) != 1 || st["bytes_host"].(float64) != size || st["bytes_peer"].(float64) != size {
		t.Errorf("split_loads %v, bytes_host %v, bytes_peer %v: want the file read once, shares exchanged", st["split_loads"], st["bytes_host"], st["bytes_peer"])
	}
	for _, name := range []string{"host0", "host1"} {
		if d := deviceOf(t, m, name); d["staged_files"].(float64) != 1 {
			t.Errorf("%s: %v, want the replica", name, d)
		}
	}
	if !strings.Contains(m.control("stats"), "[devices]\nhost0 ") {
		t.Errorf("stats lacks the devices section:\n%s", m.control("stats"))
	}

	h0, r0 := holdOn(t, "host0", p)
	h1, r1 := holdOn(t, "1", p) // by ordinal
	for _, r := range []map[string]any{r0, r1} {
		if r["sha256"] != want {
			t.Errorf("lease %v: sha256 differs from the file's", r)
		}
	}
	if r0["device"] != "host0" || r1["device"] != "host1" || r0["generation"] != r1["generation"] {
		t.Errorf("leases on %v and %v, generations %v and %v: want one replica each, one version", r0["device"], r1["device"], r0["generation"], r1["generation"])
	}
	// Both holders said "held": their leases are granted.
	checkDevice(t, m, "host0", "leases_pinned", 1)
	checkDevice(t, m, "host1", "leases_pinned", 1)

	h0.Process.Kill()
	h0.Wait()
	// Its connection's close releases its lease, then the counter drops.
	waitStat(t, m, "leases_active", 1)
	checkDevice(t, m, "host0", "leases_pinned", 0)
	if d := deviceOf(t, m, "host1"); d["leases_pinned"].(float64) != 1 {
		t.Errorf("killing host0's consumer released host1's lease too: %v", d)
	}

	writeControl(t, m, "evict", "w.bin\tgpus=0", 0)
	writeControl(t, m, "evict", "w.bin\tgpus=1", syscall.EBUSY) // leased
	writeControl(t, m, "prefetch", "w.bin\tgpus=7", syscall.EINVAL)
	cache := m.control("cache")
	if strings.Contains(cache, "\thost0\t") || !strings.Contains(cache, "\thost1\t") {
		t.Fatalf("after evicting host0's replica:\n%s", cache)
	}
	hits := statsOf(t, m)["hits"].(float64)
	out, err := exec.Command(bins.leasecheck, "-devices", "host1", p).Output()
	if err != nil || !strings.Contains(string(out), want) || !strings.Contains(string(out), `"device":"host1"`) {
		t.Fatalf("a new consumer on host1: %v %s", err, out)
	}
	if got := statsOf(t, m)["hits"].(float64); got != hits+1 {
		t.Errorf("hits %v -> %v: host1's replica was not served as it was", hits, got)
	}
	h1.Process.Signal(syscall.SIGTERM)
	h1.Wait()
}

// holdOn starts a consumer holding path's lease on device; it returns the
// process and its lease's JSON line.
func holdOn(t *testing.T, device, path string) (*exec.Cmd, map[string]any) {
	t.Helper()
	cmd := exec.Command(bins.leasecheck, "-hold", "-devices", device, path)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); cmd.Process.Kill(); cmd.Wait() })
	r := bufio.NewReader(stdout)
	line, err := r.ReadString('\n')
	var res map[string]any
	if err != nil || json.Unmarshal([]byte(line), &res) != nil {
		t.Fatalf("leasecheck -hold -devices %s: %v %q", device, err, line)
	}
	if held, _ := r.ReadString('\n'); held != "held\n" {
		t.Fatalf("leasecheck did not hold: %q", held)
	}
	return cmd, res
}

// deviceOf is stats.json's entry of the device named name.
func deviceOf(t *testing.T, m *mount, name string) map[string]any {
	t.Helper()
	for _, d := range statsOf(t, m)["devices"].([]any) {
		if dm := d.(map[string]any); dm["name"] == name {
			return dm
		}
	}
	t.Fatalf("no device %s in stats.json", name)
	return nil
}

// checkDevice checks the device's key in stats.json.
func checkDevice(t *testing.T, m *mount, name, key string, want float64) {
	t.Helper()
	if got := deviceOf(t, m, name)[key].(float64); got != want {
		t.Fatalf("%s %s = %v, want %v", name, key, got, want)
	}
}

// writeControl writes one line to a control file and checks its errno
// (0: success).
func writeControl(t *testing.T, m *mount, name, line string, want syscall.Errno) {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(m.mnt, ".gdsfs", name), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.WriteString(line + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	var got syscall.Errno
	if pe, ok := err.(*os.PathError); ok {
		got, _ = pe.Err.(syscall.Errno)
	} else if err != nil {
		t.Fatalf("%s %q: %v", name, line, err)
	}
	if got != want {
		t.Errorf("%s %q: errno %v, want %v", name, line, got, want)
	}
}

func fileSum(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// Placement through the mount: a file staged on host0 only, leased by a
// consumer on host1, is copied there device to device under placement
// replica (each replica counted on its own device) and served from host0
// under node; a file staged nowhere is staged on the device asked under
// both.
func TestLeasePlacementOnHostDevices(t *testing.T) {
	const size = 1<<20 + 13
	for _, tc := range []struct {
		placement, device string
		onHost1           float64 // files staged on host1 after the lease
	}{
		{"replica", "host1", 1},
		{"node", "host0", 0},
	} {
		t.Run(tc.placement, func(t *testing.T) {
			src := t.TempDir()
			randomFile(t, filepath.Join(src, "a.bin"), size, 21)
			randomFile(t, filepath.Join(src, "b.bin"), size, 22)
			want := fileSum(t, filepath.Join(src, "a.bin"))
			m := startMount(t, src, "staging.device=host", "staging.host_devices=2", "staging.capacity=16MiB",
				"staging.prefetch=manual", "staging.placement="+tc.placement, "staging.racy_window=0s")
			sh(t, fmt.Sprintf("%s warmup --wait --gpus 0 %s", bins.gdsfs, m.path("a.bin")))
			if d := deviceOf(t, m, "host1"); d["staged_files"].(float64) != 0 {
				t.Fatalf("warmup --gpus 0 staged on host1 too: %v", d)
			}
			r := leaseOn(t, "host1", m.path("a.bin"))
			if r["device"] != tc.device || r["sha256"] != want {
				t.Errorf("a lease on host1: %v, want device %s and the file's sha256", r, tc.device)
			}
			h0, h1 := deviceOf(t, m, "host0"), deviceOf(t, m, "host1")
			if h0["staged_files"].(float64) != 1 || h1["staged_files"].(float64) != tc.onHost1 {
				t.Errorf("staged files host0 %v, host1 %v; want 1 and %v", h0["staged_files"], h1["staged_files"], tc.onHost1)
			}
			if tc.onHost1 == 1 && (h1["bytes_peer"].(float64) != size || h1["used_bytes"].(float64) < size || h1["bytes_read"].(float64) != 0) {
				t.Errorf("host1 %v: want the replica copied from host0 and counted on host1", h1)
			}
			if r := leaseOn(t, "host1", m.path("b.bin")); r["device"] != "host1" {
				t.Errorf("a file staged nowhere, leased on host1, went to %v", r["device"])
			}
		})
	}
}

// Capacity is per device: making room on host0 evicts host0's replica
// only; host1's is still served, without a load.
func TestReplicaEvictedOnOneDevice(t *testing.T) {
	const size = 3 << 20
	src := t.TempDir()
	randomFile(t, filepath.Join(src, "a.bin"), size, 23)
	randomFile(t, filepath.Join(src, "b.bin"), size, 24)
	m := startMount(t, src, "staging.device=host", "staging.host_devices=2", "staging.capacity=5MiB",
		"staging.prefetch=manual", "staging.racy_window=0s")
	sh(t, fmt.Sprintf("%s warmup --wait --gpus all %s", bins.gdsfs, m.path("a.bin")))
	sh(t, fmt.Sprintf("%s warmup --wait --gpus host0 %s", bins.gdsfs, m.path("b.bin")))
	h0, h1 := deviceOf(t, m, "host0"), deviceOf(t, m, "host1")
	if h0["evictions"].(float64) != 1 || h1["evictions"].(float64) != 0 || h1["staged_files"].(float64) != 1 {
		t.Fatalf("host0 %v\nhost1 %v\nwant a.bin evicted from host0 only", h0, h1)
	}
	if cache := m.control("cache"); replicaLine(cache, "a.bin", "host0") || !replicaLine(cache, "a.bin", "host1") {
		t.Errorf("cache: want a.bin on host1 only:\n%s", cache)
	}
	misses := statsOf(t, m)["misses"].(float64)
	if r := leaseOn(t, "host1", m.path("a.bin")); r["device"] != "host1" {
		t.Errorf("a.bin on host1 after host0's eviction: %v", r)
	}
	if got := statsOf(t, m)["misses"].(float64); got != misses {
		t.Errorf("misses %v -> %v: host1's replica was staged again", misses, got)
	}
}

// leaseOn leases path on device with the Go client (leasecheck) and
// returns its JSON line.
func leaseOn(t *testing.T, device, path string) map[string]any {
	t.Helper()
	out, err := exec.Command(bins.leasecheck, "-devices", device, path).Output()
	var r map[string]any
	if err != nil || json.Unmarshal(out, &r) != nil {
		t.Fatalf("leasecheck -devices %s %s: %v %s", device, path, err, out)
	}
	return r
}

// replicaLine says whether .gdsfs/cache's text has a line of rel on
// device.
func replicaLine(cache, rel, device string) bool {
	for _, line := range strings.Split(cache, "\n") {
		if f := strings.Split(line, "\t"); len(f) > 6 && f[0] == rel && f[6] == device {
			return true
		}
	}
	return false
}
