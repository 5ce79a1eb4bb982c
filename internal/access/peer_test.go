package access

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// TestMain lets a test run this binary as a socket client: with
// GDSFS_ACCESS_TEST_CONNECT set, it connects there and exits at once.
func TestMain(m *testing.M) {
	if p := os.Getenv("GDSFS_ACCESS_TEST_CONNECT"); p != "" {
		c, err := net.Dial("unix", p)
		if err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(2)
		}
		if exe := os.Getenv("GDSFS_ACCESS_TEST_EXEC"); exe != "" {
			// fd 3 closes at the exec: the test knows it happened
			unix.CloseOnExec(3)
			err = syscall.Exec(exe, []string{exe, "60"}, nil)
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(2)
		}
		c.Close()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// accepted returns the daemon's end of a connection made by cmd (run to
// its end before the connection is accepted) or by this process (cmd nil).
func accepted(t *testing.T, cmd *exec.Cmd) int {
	t.Helper()
	p := filepath.Join(t.TempDir(), "s")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: p, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	if cmd != nil {
		cmd.Env = append(os.Environ(), "GDSFS_ACCESS_TEST_CONNECT="+p)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%v: %v\n%s", cmd.Args, err, out)
		}
	} else {
		c, err := net.Dial("unix", p)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
	}
	return acceptFD(t, ln)
}

// TestPeerCapabilities: a live peer with the daemon's ids has its
// capabilities; a peer that has exited (its pid free to be reused) has
// none, whatever its uid.
func TestPeerCapabilities(t *testing.T) {
	needRoot(t)
	c, err := Peer(accepted(t, nil))
	if err != nil || c.UID != 0 || c.Caps != Daemon().Caps {
		t.Fatalf("this process as a peer: %v %v, want uid 0 with caps %#x", c, err, Daemon().Caps)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	c, err = Peer(accepted(t, exec.Command(exe)))
	if err != nil || c.UID != 0 || c.Caps != 0 {
		t.Fatalf("a root peer that exited: %v %v, want uid 0 with no capability", c, err)
	}
}

// TestPeerCapabilitiesGainedByExec: a peer of uid 65534 without
// capabilities that connects and then executes a program with file
// capabilities (cap_dac_read_search+ep) had none when it connected, and
// gets none.
func TestPeerCapabilitiesGainedByExec(t *testing.T) {
	needRoot(t)
	setcap, err := exec.LookPath("setcap")
	if err != nil {
		t.Skip("SKIPPED: setcap (libcap2-bin) is needed to give a program file capabilities")
	}
	dir, err := os.MkdirTemp("", "gdsfs-peer-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	copyExe := func(from, to string) {
		b, err := os.ReadFile(from)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(to, b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	client, capped := filepath.Join(dir, "client"), filepath.Join(dir, "sleep")
	copyExe(self, client)
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Fatal(err)
	}
	copyExe(sleep, capped)
	if out, err := exec.Command(setcap, "cap_dac_read_search+ep", capped).CombinedOutput(); err != nil {
		t.Fatalf("setcap: %v\n%s", err, out)
	}
	p := filepath.Join(dir, "s")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: p, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	if err := os.Chmod(p, 0o666); err != nil {
		t.Fatal(err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	cmd := exec.Command(client)
	cmd.Env = []string{"GDSFS_ACCESS_TEST_CONNECT=" + p, "GDSFS_ACCESS_TEST_EXEC=" + capped}
	cmd.ExtraFiles = []*os.File{w}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{}}}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	if _, err := io.ReadAll(r); err != nil { // EOF: the peer has executed the program
		t.Fatal(err)
	}
	if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", cmd.Process.Pid)); err != nil || exe != capped {
		t.Fatalf("the peer runs %q (%v), not %s", exe, err, capped)
	}
	c, err := ln.AcceptUnix()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	f, err := c.File()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got, err := Peer(int(f.Fd()))
	if err != nil || got.UID != 65534 || got.Caps != 0 {
		t.Fatalf("a peer that gained capabilities by exec after connecting: %v %v, want uid 65534 with no capability", got, err)
	}
}

// acceptFD accepts a connection on ln and returns its descriptor, closed
// at the test's end.
func acceptFD(t *testing.T, ln *net.UnixListener) int {
	t.Helper()
	c, err := ln.AcceptUnix()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	f, err := c.File()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return int(f.Fd())
}

// livePeer returns the daemon's end of a connection from a peer that this
// test binary starts under the command wrap (a program and its arguments,
// to which the binary is appended) and that then executes sleep, so it
// stays alive. The test is skipped, saying so, where wrap cannot run here.
func livePeer(t *testing.T, wrap ...string) int {
	t.Helper()
	prog, err := exec.LookPath(wrap[0])
	if err != nil {
		t.Skipf("SKIPPED: %s (util-linux) is needed to start the peer", wrap[0])
	}
	args := wrap[1:]
	if out, err := exec.Command(prog, append(args, "true")...).CombinedOutput(); err != nil {
		t.Skipf("SKIPPED: %v cannot run here: %v\n%s", wrap, err, out)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "s")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: p, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	cmd := exec.Command(prog, append(args, self)...)
	cmd.Env = []string{"GDSFS_ACCESS_TEST_CONNECT=" + p, "GDSFS_ACCESS_TEST_EXEC=" + sleep}
	cmd.ExtraFiles = []*os.File{w}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	if _, err := io.ReadAll(r); err != nil { // EOF: the peer has connected and executed sleep
		t.Fatal(err)
	}
	return acceptFD(t, ln)
}

// TestPeerCapabilitiesOfALivePeer: a live uid-0 peer whose bounding set
// lacks CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH has its own effective
// capabilities, not the daemon's, read through its pidfd (PIDFD_GET_INFO
// and capget), and /proc/PID/status (what kernels before Linux 6.13 are
// asked) gives the same.
func TestPeerCapabilitiesOfALivePeer(t *testing.T) {
	needRoot(t)
	fd := livePeer(t, "setpriv", "--bounding-set", "-dac_override,-dac_read_search", "--")
	want := Daemon().Caps &^ (1<<unix.CAP_DAC_OVERRIDE | 1<<unix.CAP_DAC_READ_SEARCH)
	got, err := Peer(fd)
	if err != nil || got.UID != 0 || got.Caps != want {
		t.Fatalf("a live root peer without dac_override and dac_read_search: %v %v, want uid 0 with caps %#x", got, err, want)
	}
	uc, err := unix.GetsockoptUcred(fd, unix.SOL_SOCKET, unix.SO_PEERCRED)
	if err != nil {
		t.Fatal(err)
	}
	pidfd, err := unix.PidfdOpen(int(uc.Pid), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(pidfd)
	byStatus, err := procCred(uc.Pid, pidfd, effectiveIDs, 0, 0)
	if err != nil || byStatus.Caps != want {
		t.Fatalf("/proc/%d/status: caps %#x (%v), want %#x", uc.Pid, byStatus.Caps, err, want)
	}
	byPidfd, err := pidfdCaps(uc.Pid, pidfd, effectiveIDs, 0, 0)
	if errors.Is(err, errNoPidfdInfo) {
		t.Logf("this kernel answers no PIDFD_GET_INFO: Peer read /proc/%d/status", uc.Pid)
		return
	}
	if err != nil || byPidfd != want {
		t.Fatalf("pidfd and capget: caps %#x (%v), want %#x", byPidfd, err, want)
	}
	if _, err := pidfdCaps(uc.Pid, pidfd, effectiveIDs, 65534, 0); err == nil || errors.Is(err, errNoPidfdInfo) {
		t.Fatalf("pidfd and capget asked for uid 65534 of a root peer: %v, want an error naming its ids", err)
	}
}

// TestPeerCapabilitiesInAChildUserNamespace: a live peer that is root,
// uid 0 mapped to the daemon's uid 0, with every capability in a user
// namespace of its own has none here: capget answers its capabilities
// in that namespace, which grant nothing in the daemon's.
func TestPeerCapabilitiesInAChildUserNamespace(t *testing.T) {
	needRoot(t)
	got, err := Peer(livePeer(t, "unshare", "--user", "--map-user=0", "--map-group=0", "--"))
	if err != nil || got.UID != 0 || got.Caps != 0 {
		t.Fatalf("a root peer with every capability in its own user namespace: %v %v, want uid 0 with no capability", got, err)
	}
}

// TestFromPID: a FUSE caller with the daemon's ids and every capability it
// has (this test's own thread) has those capabilities; a root caller with
// fewer has its own, and its supplementary groups as /proc/PID/status
// gives them; a caller whose fs ids are not the request's has none.
func TestFromPID(t *testing.T) {
	needRoot(t)
	runtime.LockOSThread()
	c, err := FromPID(int32(unix.Gettid()), 0, 0)
	runtime.UnlockOSThread()
	if err != nil || c.UID != 0 || c.Caps != Daemon().Caps {
		t.Fatalf("this thread: %v %v, want uid 0 with caps %#x", c, err, Daemon().Caps)
	}
	fd := livePeer(t, "setpriv", "--bounding-set", "-dac_override,-dac_read_search", "--")
	uc, err := unix.GetsockoptUcred(fd, unix.SOL_SOCKET, unix.SO_PEERCRED)
	if err != nil {
		t.Fatal(err)
	}
	want := Daemon().Caps &^ (1<<unix.CAP_DAC_OVERRIDE | 1<<unix.CAP_DAC_READ_SEARCH)
	byStatus, err := procCred(uc.Pid, -1, fsIDs, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	c, err = FromPID(uc.Pid, 0, 0)
	if err != nil || c.UID != 0 || c.Caps != want || !slices.Equal(c.Groups, byStatus.Groups) {
		t.Fatalf("a root caller without dac_override and dac_read_search: %v %v, want caps %#x and groups %v", c, err, want, byStatus.Groups)
	}
	if c, err := FromPID(uc.Pid, 65534, 65534); err == nil || c.Caps != 0 || len(c.Groups) != 0 {
		t.Fatalf("a root caller named as uid 65534: %v %v, want an error, no capability and no group", c, err)
	}
}
