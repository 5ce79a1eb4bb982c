package integration

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/client"
	"github.com/gdsfs/gdsfs/proto"
)

// xattr reads a user.gdsfs.* attribute through getfattr, as a user would.
func xattr(t *testing.T, path, name string) string {
	t.Helper()
	out, err := exec.Command("getfattr", "--absolute-names", "--only-values", "-n", "user.gdsfs."+name, path).CombinedOutput()
	if err != nil {
		return "error: " + strings.TrimSpace(string(out))
	}
	return string(out)
}

// waitState waits until path's state is want (or failed, which fails the
// test), through the daemon's wait request made by the Go client: the
// daemon answers when the state changes; nothing is polled.
func waitState(t *testing.T, path, want string) {
	t.Helper()
	r, err := client.Wait(path, []string{want, proto.StateFailed}, 20*time.Second)
	if err != nil {
		t.Fatalf("%s: waiting for %s: %v (user.gdsfs.state: %q)", path, want, err, xattr(t, path, "state"))
	}
	if r.State != want {
		t.Fatalf("%s: state %q, want %q", path, r.State, want)
	}
}

func statsOf(t *testing.T, m *mount) map[string]any {
	t.Helper()
	var s map[string]any
	if err := json.Unmarshal([]byte(m.control("stats.json")), &s); err != nil {
		t.Fatal(err)
	}
	return s
}

// leaseSum leases path with the Go client and returns its JSON line.
func leaseSum(t *testing.T, path string) map[string]any {
	t.Helper()
	out, err := exec.Command(bins.leasecheck, path).CombinedOutput()
	if err != nil {
		t.Fatalf("leasecheck %s: %v\n%s", path, err, out)
	}
	var r map[string]any
	json.Unmarshal(out, &r)
	return r
}

func sha(t *testing.T, path string) string {
	return strings.Fields(sh(t, "sha256sum "+path))[0]
}

// TestOpenStages: opening a file through the mount stages it; the staged
// bytes are the file's; stats, xattrs and the cache listing agree.
func TestOpenStages(t *testing.T) {
	need(t, "getfattr")
	src := sourceTree(t)
	// Staged at open: this test is about open as the trigger, not about
	// waiting for the reader (staging.defer_while_read).
	m := startMount(t, src, "staging.chunk_size=1MiB", "io.task_size=256KiB", "staging.defer_while_read=false")
	big := m.path("data/fg.bin") // 9 MiB: nine chunks, many tasks
	if got := xattr(t, big, "state"); got != "absent" {
		t.Fatalf("state before any open: %q", got)
	}
	sh(t, "cat "+big+" > /dev/null")
	waitState(t, big, "resident")
	if got := xattr(t, big, "path"); got != "host" {
		t.Fatalf("user.gdsfs.path = %q, want host", got)
	}
	r := leaseSum(t, big)
	if r["sha256"] != sha(t, filepath.Join(src, "data/fg.bin")) || r["device"] != "host" {
		t.Fatalf("staged bytes differ from the file: %v", r)
	}
	s := statsOf(t, m)
	if s["bytes_host"].(float64) != 9<<20 || s["staged_files"].(float64) != 1 || s["bytes_posix"].(float64) != 0 {
		t.Fatalf("stats disagree: bytes_host %v staged %v", s["bytes_host"], s["staged_files"])
	}
	cache := m.control("cache")
	if !strings.Contains(cache, "data/fg.bin\t9437184\tresident\thost\t") {
		t.Fatalf("cache listing:\n%s", cache)
	}
	if got := xattr(t, m.path("hello.txt"), "state"); got != "absent" {
		t.Fatalf("an unopened file is %q", got)
	}
}

// TestPrefetchAndEvictControls drives staging through .gdsfs/prefetch and
// .gdsfs/evict, with staging.prefetch=manual so opens do not stage.
func TestPrefetchAndEvictControls(t *testing.T) {
	need(t, "getfattr")
	src := sourceTree(t)
	// One prefetch worker: files are staged one after another, in the
	// order they were queued.
	m := startMount(t, src, "staging.prefetch=manual", "staging.prefetch_workers=1")
	f := m.path("data/ff.bin")
	sh(t, "cat "+f+" > /dev/null")
	// Had the open queued f, it would be staged before a file queued
	// after it: once that one is resident, f would be too.
	sh(t, "echo data/fd.bin > "+m.path(".gdsfs/prefetch"))
	waitState(t, m.path("data/fd.bin"), "resident")
	if got := xattr(t, f, "state"); got != "absent" {
		t.Fatalf("manual mode staged on open: %q", got)
	}
	sh(t, "printf 'data/ff.bin\\n%s\\n' "+m.path("data/fe.bin")+" > "+m.path(".gdsfs/prefetch"))
	waitState(t, f, "resident")
	waitState(t, m.path("data/fe.bin"), "resident")
	for line, want := range map[string]string{
		"data/missing.bin": "No such file or directory",
		"data":             "Invalid argument",
		"../../etc/passwd": "No such file or directory", // cleaned to etc/passwd under SOURCE
	} {
		msg := shErr(t, "echo "+line+" > "+m.path(".gdsfs/prefetch"))
		if !strings.Contains(msg, want) {
			t.Errorf("prefetch %s: %q, want %q", line, msg, want)
		}
	}
	sh(t, "echo data/ff.bin > "+m.path(".gdsfs/evict"))
	if got := xattr(t, f, "state"); got != "absent" {
		t.Fatalf("after evict: %q", got)
	}
	if msg := shErr(t, "echo data/ff.bin > "+m.path(".gdsfs/evict")); !strings.Contains(msg, "No such file") {
		t.Errorf("evict of an unstaged file: %q", msg)
	}
	if s := statsOf(t, m); s["evictions"].(float64) != 1 {
		t.Errorf("evictions = %v", s["evictions"])
	}
}

// TestChangedSourceRestaged: a file changed in SOURCE is invalidated at
// the next open and staged again with the new bytes.
func TestChangedSourceRestaged(t *testing.T) {
	src := sourceTree(t)
	m := startMount(t, src, "staging.defer_while_read=false")
	rel := "data/fd.bin"
	sh(t, "cat "+m.path(rel)+" > /dev/null")
	waitState(t, m.path(rel), "resident")
	first := leaseSum(t, m.path(rel))
	randomFile(t, filepath.Join(src, rel), 131073, 77) // same size, new bytes
	sh(t, "cat "+m.path(rel)+" > /dev/null")
	waitState(t, m.path(rel), "resident")
	second := leaseSum(t, m.path(rel))
	if second["sha256"] != sha(t, filepath.Join(src, rel)) || second["sha256"] == first["sha256"] {
		t.Fatal("a lease after the change does not see the new bytes")
	}
	if second["generation"].(float64) <= first["generation"].(float64) {
		t.Fatalf("generation %v -> %v", first["generation"], second["generation"])
	}
	if s := statsOf(t, m); s["invalidations"].(float64) < 1 {
		t.Fatalf("invalidations = %v", s["invalidations"])
	}
}

// TestLoadFailureLeavesFileReadable: a file that cannot be staged (larger
// than the capacity) is still read through the mount and counted.
func TestLoadFailureLeavesFileReadable(t *testing.T) {
	src := sourceTree(t)
	m := startMount(t, src, "staging.capacity=1MiB", "staging.defer_while_read=false")
	big := "data/fg.bin"
	if sha(t, m.path(big)) != sha(t, filepath.Join(src, big)) {
		t.Fatal("a file too large to stage does not read back right")
	}
	// The open queued it (it reads as loading); staging it fails at once,
	// and the daemon says so: absent again.
	if r, err := client.Wait(m.path(big), []string{proto.StateAbsent, proto.StateFailed}, 20*time.Second); err != nil || r.State != "absent" {
		t.Fatalf("after the open: %+v %v, want absent", r, err)
	}
	if s := statsOf(t, m); s["too_large"].(float64) < 1 {
		t.Fatalf("too_large = %v, want it counted", s["too_large"])
	}
	if msg := shErr(t, "echo "+big+" > "+m.path(".gdsfs/prefetch")); !strings.Contains(msg, "File too large") {
		t.Errorf("prefetch of a too-large file: %q\n%s", msg, m.log)
	}
	os.Remove(filepath.Join(src, "nothing"))
}

// startMountLimited is startMount with the daemon's RLIMIT_NOFILE (soft
// and hard) set to nofile by prlimit, as a small limit would be set.
func startMountLimited(t *testing.T, src string, nofile int, sets ...string) *mount {
	t.Helper()
	need(t, "prlimit")
	wrapper := filepath.Join(t.TempDir(), "gdsfs-limited")
	script := fmt.Sprintf("#!/bin/sh\nexec prlimit --nofile=%d:%d -- %s \"$@\"\n", nofile, nofile, bins.gdsfs)
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	real := bins.gdsfs
	bins.gdsfs = wrapper // exec all the way: the daemon keeps the pid started
	defer func() { bins.gdsfs = real }()
	return startMount(t, src, sets...)
}

// TestManySmallFilesFewDescriptors: 6,000 small files
// staged by a daemon whose descriptor limit is 1,024: staged regions stay
// within the descriptor budget (evicting), no load fails, and the mount
// still reads every file, before and after.
func TestManySmallFilesFewDescriptors(t *testing.T) {
	const files, nofile = 6000, 1024 // files many times the limit, and more so the budget: it must evict
	src := t.TempDir()
	for d := range files / 1000 {
		dir := filepath.Join(src, fmt.Sprintf("d%02d", d))
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for i := range 1000 {
			n := d*1000 + i
			body := strings.Repeat(fmt.Sprintf("file %d;", n), 1+n%300)
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%03d", i)), []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	m := startMountLimited(t, src, nofile, "staging.prefetch_queue=65536", "staging.prefetch_workers=4",
		"staging.defer_while_read=false", "staging.readahead_files=0") // each file staged by its open, counted as a miss
	list := filepath.Join(t.TempDir(), "list")
	sh(t, "cd "+src+" && find . -type f | sort > "+list)
	want := sh(t, "cd "+src+" && xargs cat < "+list+" | sha256sum")
	if got := sh(t, "cd "+m.mnt+" && xargs cat < "+list+" | sha256sum"); got != want {
		t.Fatal("reading every file through the mount gave other bytes")
	}
	// Every file was queued by its open: wait on one connection until none
	// is loading (each is resident, evicted since, or failed).
	c, err := client.Dial(m.sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, rel := range strings.Fields(sh(t, "cat "+list)) {
		rel = strings.TrimPrefix(rel, "./")
		if _, err := c.Wait(rel, []string{proto.StateResident, proto.StateAbsent, proto.StateFailed}, 5*time.Minute); err != nil {
			t.Fatalf("%s: %v", rel, err)
		}
	}
	s := statsOf(t, m)
	if s["load_errors"].(float64) != 0 || s["misses"].(float64) != files || s["prefetch_dropped"].(float64) != 0 {
		t.Fatalf("load errors %v, loads %v of %d, dropped %v\n%s", s["load_errors"], s["misses"], files, s["prefetch_dropped"], m.log)
	}
	budget := s["descriptor_budget"].(float64)
	// the reserve is at its floor, 512, above a quarter of the limit
	if budget != nofile-512 || s["descriptors_used"].(float64) > budget || s["staged_files"].(float64) > budget ||
		s["evictions"].(float64) < files-budget {
		t.Fatalf("descriptors %v of %v, staged %v, evictions %v", s["descriptors_used"], budget, s["staged_files"], s["evictions"])
	}
	if got := sh(t, "cd "+m.mnt+" && xargs cat < "+list+" | sha256sum"); got != want {
		t.Fatal("reading every file through the mount after staging gave other bytes")
	}
	last := fmt.Sprintf("d%02d/f999", files/1000-1)
	if r := leaseSum(t, m.path(last)); r["sha256"] != sha(t, filepath.Join(src, last)) {
		t.Fatalf("lease of %s: %v", last, r)
	}
}

// TestStagedAfterReaderCloses: with staging.defer_while_read (the
// default), a file opened through the mount is not staged while it is
// being read, so staging never competes with the reader; the close (FUSE
// release, reported by fs) starts it.
func TestStagedAfterReaderCloses(t *testing.T) {
	src := t.TempDir()
	randomFile(t, filepath.Join(src, "shard.bin"), 3<<20+5, 11)
	m := startMount(t, src, "staging.defer_limit=10m")
	p := m.path("shard.bin")
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1<<20)
	if _, err := f.Read(buf); err != nil {
		f.Close()
		t.Fatal(err)
	}
	if got := xattr(t, p, "state"); got != "absent" {
		f.Close()
		t.Fatalf("state while the reader holds the file open: %q, want absent", got)
	}
	f.Close()
	waitState(t, p, "resident")
	if sha(t, p) != sha(t, filepath.Join(src, "shard.bin")) {
		t.Fatal("bytes through the mount differ from SOURCE")
	}
}

// TestStagedAfterTheReaderUnmaps: a loader that opens the file, maps it,
// closes it and then reads the mapping (safetensors 0.8) must not find the
// staging after its close running beside it. The file is staged once the
// mapping is gone, whose /proc/PID/maps line shows the mount's device and
// inode.
func TestStagedAfterTheReaderUnmaps(t *testing.T) {
	src := t.TempDir()
	const size = 64<<20 + 4096
	randomFile(t, filepath.Join(src, "model.safetensors"), size, 12)
	m := startMount(t, src, "staging.defer_limit=10m")
	p := m.path("model.safetensors")
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	data, err := unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ, unix.MAP_SHARED)
	f.Close() // the last close through the mount: the mapping reads on
	if err != nil {
		t.Fatal(err)
	}
	unmapped := false
	defer func() {
		if !unmapped {
			unix.Munmap(data)
		}
	}()
	var sum byte
	for i := 0; i < size; i += 4096 {
		sum ^= data[i] // the reader reads it all, through the mapping
	}
	// While the mapping lasts the file is not staged, however long that is
	// (staging.defer_limit is 10 minutes): a second of it is asked for.
	r, err := client.Wait(p, []string{proto.StateResident, proto.StateFailed}, time.Second)
	if err == nil {
		t.Fatalf("%s became %s while its reader maps it", p, r.State)
	}
	if !errors.Is(err, syscall.ETIMEDOUT) {
		t.Fatal(err)
	}
	if err := unix.Munmap(data); err != nil {
		t.Fatal(err)
	}
	unmapped = true
	waitState(t, p, "resident")
	if n, _ := statsOf(t, m)["mapped_read_waits"].(float64); n < 1 {
		t.Fatalf("mapped_read_waits %v, want at least 1", statsOf(t, m)["mapped_read_waits"])
	}
	t.Logf("read through the mapping (xor of a byte per page: %d)", sum)
}
