package integration

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gdsfs/gdsfs/client"
)

// holder is a leasecheck process holding leases until released or killed.
type holder struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Reader
	first []map[string]any // its leases as it first read them
}

func hold(t *testing.T, paths ...string) *holder {
	t.Helper()
	cmd := exec.Command(bins.leasecheck, append([]string{"-hold"}, paths...)...)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h := &holder{cmd: cmd, stdin: stdin, out: bufio.NewReader(stdout)}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	h.first = h.results(t)
	return h
}

// results reads the holder's JSON lines up to its next "held".
func (h *holder) results(t *testing.T) []map[string]any {
	t.Helper()
	var out []map[string]any
	for {
		line, err := h.out.ReadString('\n')
		if err != nil {
			t.Fatalf("leasecheck -hold: %v", err)
		}
		if line == "held\n" {
			return out
		}
		var r map[string]any
		if json.Unmarshal([]byte(line), &r) == nil {
			out = append(out, r)
		}
	}
}

// sum has the holder read its leases again, through its mappings.
func (h *holder) sum(t *testing.T) []map[string]any {
	t.Helper()
	if _, err := io.WriteString(h.stdin, "sum\n"); err != nil {
		t.Fatal(err)
	}
	return h.results(t)
}

// release lets the holder close its leases and exit; it returns the exit error.
func (h *holder) release() error {
	h.stdin.Close()
	return h.cmd.Wait()
}

// waitStat waits until the daemon's lease counter key (a stats.json key
// the lease server owns, proto.WaitStatKeys) is want, through the
// daemon's wait_stat request: it answers when the counter changes; nothing
// is polled. The request goes on one connection kept open for the mount's
// life (m.waiter; opened again if the daemon closed it as idle), so that
// what the test reads next (stats, the daemon's descriptors) does not
// change as it closes. ipc_open_connections leaves it out.
func waitStat(t *testing.T, m *mount, key string, want int64) {
	t.Helper()
	for attempt := 0; ; attempt++ {
		if m.waiter == nil {
			c, err := client.Dial(m.sock)
			if err != nil {
				t.Fatal(err)
			}
			m.waiter = c
		}
		err := m.waiter.WaitStat(key, want, 10*time.Second)
		switch {
		case err == nil:
			return
		case errors.Is(err, syscall.ETIMEDOUT) || attempt > 0:
			t.Fatalf("%s: %v (stats.json: %v)", key, err, statsOf(t, m)[key])
		}
		m.waiter.Close() // closed by the daemon (ipc.idle_timeout): again on a new one
		m.waiter = nil
	}
}

// TestLeaseBytesAndPermissions: the Go client reads back the exact bytes;
// a user who cannot read the backing file gets EACCES.
func TestLeaseBytesAndPermissions(t *testing.T) {
	src := sourceTree(t)
	os.Chmod(src, 0o755)
	randomFile(t, filepath.Join(src, "secret.bin"), 70000, 5)
	os.Chmod(filepath.Join(src, "secret.bin"), 0o600)
	os.Chmod(filepath.Join(src, "data/fe.bin"), 0o644)
	// A readable file in a directory uid 65534 may not search, and a link
	// to it from one it may: the link must not be a way in.
	randomFile(t, filepath.Join(src, "private/sub/file"), 5000, 6)
	os.Chmod(filepath.Join(src, "private"), 0o700)
	os.MkdirAll(filepath.Join(src, "u"), 0o755)
	os.Symlink("../private/sub/file", filepath.Join(src, "u/l"))
	os.Symlink("fe.bin", filepath.Join(src, "data/latest"))
	m := startMount(t, src, "fuse.allow_other=true", "staging.chunk_size=64KiB")
	// The test's temp directories are 0700: let uid 65534 reach the mount
	// and the socket.
	os.Chmod(filepath.Dir(m.mnt), 0o755)
	os.Chmod(filepath.Dir(strings.TrimSpace(m.control("socket"))), 0o755)
	for _, rel := range []string{"data/fa.bin", "data/fb.bin", "data/fe.bin", "data/fg.bin", "secret.bin"} {
		r := leaseSum(t, m.path(rel))
		if r["sha256"] != sha(t, filepath.Join(src, rel)) {
			t.Errorf("%s: leased bytes differ from the file", rel)
		}
	}
	nobody := &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	run := func(rel string) (string, error) {
		cmd := exec.Command(bins.leasecheck, m.path(rel))
		cmd.SysProcAttr = nobody
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	if out, err := run("secret.bin"); err == nil || !strings.HasPrefix(out, "EACCES") {
		t.Fatalf("uid 65534 leasing a 0600 root file: %v %q, want EACCES", err, out)
	}
	if out, err := run("data/fe.bin"); err != nil {
		t.Fatalf("uid 65534 leasing a world-readable file: %v %s", err, out)
	}
	if out, err := run("data/latest"); err != nil {
		t.Fatalf("uid 65534 leasing through a link it may follow: %v %s", err, out)
	}
	if out, err := run("u/l"); err == nil || !strings.HasPrefix(out, "EACCES") {
		t.Fatalf("uid 65534 leasing through a link into a directory it may not search: %v %q, want EACCES", err, out)
	}
	if s := statsOf(t, m); s["lease_denied"].(float64) != 2 {
		t.Fatalf("lease_denied = %v, want 2", s["lease_denied"])
	}
}

// TestKilledClientReleases: kill -9 of a consumer ends its leases.
func TestKilledClientReleases(t *testing.T) {
	src := sourceTree(t)
	m := startMount(t, src)
	h := hold(t, m.path("data/fd.bin"), m.path("data/fe.bin"))
	waitStat(t, m, "leases_active", 2)
	h.cmd.Process.Signal(syscall.SIGKILL)
	h.cmd.Wait()
	waitStat(t, m, "leases_active", 0)
}

// TestLeasedNeverEvicted: with room for two files, a leased file stays
// while others come and go, and goes once released and space is needed.
func TestLeasedNeverEvicted(t *testing.T) {
	src := t.TempDir()
	for _, n := range []string{"a", "b", "c", "d"} {
		randomFile(t, filepath.Join(src, n), 1<<20, int(n[0]))
	}
	m := startMount(t, src, "staging.capacity=2MiB", "staging.prefetch=manual")
	h := hold(t, m.path("a"))
	for _, n := range []string{"b", "c", "d"} {
		leaseSum(t, m.path(n)) // stages n, evicting the unleased one before it
		if got := xattr(t, m.path("a"), "state"); got != "resident" {
			t.Fatalf("leased a is %q after staging %s", got, n)
		}
	}
	if err := h.release(); err != nil {
		t.Fatal(err)
	}
	leaseSum(t, m.path("b"))
	leaseSum(t, m.path("c"))
	if got := xattr(t, m.path("a"), "state"); got != "absent" {
		t.Fatalf("released a is %q after two other files needed the space", got)
	}
}

// TestOldLeaseKeepsOldBytes: a file changed in SOURCE is re-staged for new
// leases while a lease taken before keeps the bytes it was given.
func TestOldLeaseKeepsOldBytes(t *testing.T) {
	src := t.TempDir()
	f := filepath.Join(src, "f")
	randomFile(t, f, 300000, 1)
	old := sha(t, f)
	m := startMount(t, src)
	h := hold(t, m.path("f"))
	if len(h.first) != 1 || h.first[0]["sha256"] != old {
		t.Fatalf("the lease before the change: %v, want sha256 %s", h.first, old)
	}
	randomFile(t, f, 300000, 2)
	r := leaseSum(t, m.path("f"))
	if r["sha256"] != sha(t, f) || r["sha256"] == old {
		t.Fatalf("a new lease after the change: %v, want sha256 %s", r, sha(t, f))
	}
	if r["generation"] == h.first[0]["generation"] {
		t.Fatalf("the new lease has the old lease's generation %v", r["generation"])
	}
	again := h.sum(t)
	if len(again) != 1 || again[0]["sha256"] != old {
		t.Fatalf("the old lease read again after the change: %v, want its old bytes (sha256 %s)", again, old)
	}
	if err := h.release(); err != nil { // its mapping was valid until the end
		t.Fatal(err)
	}
	waitStat(t, m, "leases_active", 0)
}

// TestGarbageOnSocket: garbage and half requests are answered or dropped
// while other clients carry on.
func TestGarbageOnSocket(t *testing.T) {
	src := sourceTree(t)
	m := startMount(t, src)
	sock := strings.TrimSpace(m.control("socket"))
	var conns []net.Conn
	for _, junk := range []string{"\x00\x01\x02garbage\n", `{"op":"acquire","path":`, strings.Repeat("z", 100000), "{}\n"} {
		c, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		c.Write([]byte(junk))
	}
	r := leaseSum(t, m.path("data/fc.bin"))
	if r["sha256"] != sha(t, filepath.Join(src, "data/fc.bin")) {
		t.Fatal("lease beside garbage connections differs")
	}
	for _, c := range conns {
		c.Close()
	}
	if s := statsOf(t, m); s["ipc_bad_requests"].(float64) < 2 {
		t.Fatalf("bad requests not counted: %v", s["ipc_bad_requests"])
	}
}

// TestDaemonRestartEndsLeases: a lease of a daemon that stopped ended with
// it: closing it is no error (nothing is left to release, and Close never
// waits for a daemon), and new leases work with the new daemon.
func TestDaemonRestartEndsLeases(t *testing.T) {
	src := sourceTree(t)
	m := startMount(t, src)
	h := hold(t, m.path("data/fc.bin"))
	m.stop()
	m2 := startMountAt(t, src, m.mnt)
	if err := h.release(); err != nil {
		t.Fatalf("closing a lease of a stopped daemon: %v", err)
	}
	r := leaseSum(t, m2.path("data/fc.bin"))
	if r["sha256"] != sha(t, filepath.Join(src, "data/fc.bin")) {
		t.Fatal("a lease of the new daemon differs from the file")
	}
}
