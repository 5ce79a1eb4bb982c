package integration

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// holdOpen starts fsuser hold PATH MAX as cred and returns the line it
// prints once it stopped opening; closing the returned pipe makes it
// close every descriptor and exit, and wait waits for that.
func holdOpen(t *testing.T, cred *syscall.Credential, path string, most int) (line string, stop io.Closer, wait func()) {
	t.Helper()
	cmd := exec.Command(bins.fsuser, "hold", path, fmt.Sprint(most))
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var errb bytes.Buffer
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waited := false
	wait = func() {
		if waited {
			return
		}
		waited = true
		if err := cmd.Wait(); err != nil {
			t.Errorf("fsuser hold %s: %v\n%s", path, err, errb.String())
		}
	}
	t.Cleanup(func() { in.Close(); wait() })
	line, err = bufio.NewReader(out).ReadString('\n')
	if err != nil {
		in.Close()
		wait()
		t.Fatalf("fsuser hold %s: %v\n%s", path, err, errb.String())
	}
	return strings.TrimSpace(line), in, wait
}

// TestOpenBoundPerUID: on an allow_other mount with
// fuse.max_open_per_uid=50, uid 65534 opening one file again and again
// gets 50 descriptors and then EMFILE, for files and directories alike
// (counted, logged once), while root
// and another uid still open, read and list, and the control files and
// the lease socket still answer. Once uid 65534 closed its descriptors its
// opens succeed again.
func TestOpenBoundPerUID(t *testing.T) {
	const bound = 50
	src := userDir(t)
	randomFile(t, filepath.Join(src, "pub.pt"), 5000, 1)
	if err := os.Chmod(filepath.Join(src, "pub.pt"), 0o644); err != nil {
		t.Fatal(err)
	}
	m := startMount(t, src, "fuse.allow_other=true", "fuse.read_only=false", fmt.Sprintf("fuse.max_open_per_uid=%d", bound))
	os.Chmod(filepath.Dir(m.mnt), 0o755)
	pub := m.path("pub.pt")

	line, stop, wait := holdOpen(t, user(), pub, 4*bound)
	if want := fmt.Sprintf("HELD %d EMFILE EMFILE EMFILE EMFILE", bound); line != want {
		t.Fatalf("uid 65534 opening %s %d times: %q, want %q", pub, 4*bound, line, want)
	}
	if got := fsuser(t, user(), "readdir", m.mnt); got != "EMFILE" {
		t.Errorf("uid 65534 listing the mount at its bound: %s, want EMFILE (a directory open holds a descriptor too)", got)
	}
	// Everyone else is served meanwhile.
	if got := sh(t, "cat "+pub+" | wc -c"); strings.TrimSpace(got) != "5000" {
		t.Errorf("root's cat of %s while uid 65534 is at its bound: %q bytes, want 5000", pub, got)
	}
	if got := sh(t, "ls "+m.mnt); !strings.Contains(got, "pub.pt") {
		t.Errorf("root's ls of the mount while uid 65534 is at its bound: %q", got)
	}
	if got := m.control("socket"); strings.TrimSpace(got) != m.sock {
		t.Errorf(".gdsfs/socket while uid 65534 is at its bound: %q, want %q", got, m.sock)
	}
	other := &syscall.Credential{Uid: nobody - 1, Gid: nobody}
	if got := fsuser(t, other, "read", pub); !strings.HasPrefix(got, "OK") {
		t.Errorf("uid %d reading %s while uid 65534 is at its bound: %.40s, want OK", nobody-1, pub, got)
	}
	if r := leaseSum(t, pub); r["sha256"] != sha(t, filepath.Join(src, "pub.pt")) {
		t.Errorf("root's lease of %s while uid 65534 is at its bound: %v", pub, r)
	}
	stats := statsOf(t, m)
	if stats["max_open_per_uid"] != float64(bound) || stats["opens_refused"] != float64(5) {
		t.Errorf("stats: max_open_per_uid %v, opens_refused %v; want %d and 5", stats["max_open_per_uid"], stats["opens_refused"], bound)
	}
	m.log.waitFor("open refused (EMFILE)")
	if n := strings.Count(m.log.String(), "open refused (EMFILE)"); n != 1 {
		t.Errorf("the refusals of uid 65534 were logged %d times, want once:\n%s", n, m.log)
	}

	// Closing frees the budget. The kernel releases a closed file after
	// close returns: wait until the daemon has none open.
	stop.Close()
	wait()
	for deadline := time.Now().Add(10 * time.Second); statsOf(t, m)["open_files"] != float64(0); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("open_files %v 10s after uid 65534 closed its descriptors, want 0", statsOf(t, m)["open_files"])
		}
	}
	line, stop, wait = holdOpen(t, user(), pub, bound)
	if want := fmt.Sprintf("HELD %d OK", bound); line != want {
		t.Errorf("uid 65534 opening %s %d times after closing the others: %q, want %q", pub, bound, line, want)
	}
	stop.Close()
	wait()
}
