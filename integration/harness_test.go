package integration

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gdsfs/gdsfs/client"
	"github.com/gdsfs/gdsfs/internal/mountinfo"
)

// bins holds the binaries TestMain builds: gdsfs, the lease checker and
// the unprivileged actor.
var bins struct {
	dir, gdsfs, leasecheck, fsuser string
	skip                           string // why mounting tests cannot run here
}

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if os.Geteuid() != 0 {
		bins.skip = "integration tests mount FUSE as root (run make test as root)"
	} else if _, err := os.Stat("/dev/fuse"); err != nil {
		bins.skip = "no /dev/fuse: " + err.Error()
	}
	dir, err := os.MkdirTemp("", "gdsfs-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	os.Chmod(dir, 0o755) // other uids run the lease checker
	bins.dir = dir
	bins.gdsfs = filepath.Join(dir, "gdsfs")
	bins.leasecheck = filepath.Join(dir, "leasecheck")
	bins.fsuser = filepath.Join(dir, "fsuser")
	for out, pkg := range map[string]string{bins.gdsfs: "../cmd/gdsfs", bins.leasecheck: "./leasecheck", bins.fsuser: "./fsuser"} {
		args := []string{"build", "-o", out}
		if raceEnabled && out != bins.fsuser { // fsuser starts thousands of times
			args = append(args, "-race")
		}
		cmd := exec.Command("go", append(args, pkg)...)
		cmd.Stderr = os.Stderr
		if err := cmd.Run(); err != nil {
			fmt.Fprintf(os.Stderr, "building %s: %v\n", pkg, err)
			return 1
		}
	}
	return m.Run()
}

func needMount(t *testing.T) {
	t.Helper()
	if bins.skip != "" {
		t.Skip("SKIPPED: " + bins.skip)
	}
}

// mount is a running gdsfs daemon.
type mount struct {
	t      *testing.T
	src    string
	mnt    string
	sock   string // its lease socket (ipc.socket)
	cmd    *exec.Cmd
	log    *syncBuffer
	exited chan error
	waiter *client.Conn // waitStat's connection, kept open (see waitStat)
}

// startMount mounts src with the given --set overrides and waits until the
// daemon says it serves (READY=1, as it tells systemd). The mount is
// unmounted in t.Cleanup.
func startMount(t *testing.T, src string, sets ...string) *mount {
	t.Helper()
	needMount(t)
	return startMountAt(t, src, t.TempDir(), sets...)
}

// startMountAt is startMount on a given mountpoint.
func startMountAt(t *testing.T, src, mnt string, sets ...string) *mount {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "lease.sock")
	args := []string{"mount", "--set", "log.format=console", "--set", "ipc.socket=" + sock}
	for _, s := range sets {
		args = append(args, "--set", s)
	}
	args = append(args, src, mnt)
	notify, ready := listenReady(t)
	m := &mount{t: t, src: src, mnt: mnt, sock: sock, log: &syncBuffer{}, exited: make(chan error, 1)}
	m.cmd = exec.Command(bins.gdsfs, args...)
	m.cmd.Env = append(os.Environ(), "NOTIFY_SOCKET="+notify)
	m.cmd.Stdout, m.cmd.Stderr = m.log, m.log
	if err := m.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { m.exited <- m.cmd.Wait() }()
	select {
	case pid := <-ready:
		if pid != m.cmd.Process.Pid {
			m.cmd.Process.Kill()
			t.Fatalf("READY=1 from pid %d, not the daemon's %d", pid, m.cmd.Process.Pid)
		}
	case err := <-m.exited:
		t.Fatalf("gdsfs exited before mounting: %v\n%s", err, m.log)
	case <-time.After(20 * time.Second):
		m.cmd.Process.Kill()
		t.Fatalf("the daemon did not say READY=1 within 20s\n%s", m.log)
	}
	t.Cleanup(m.stop)
	return m
}

// listenReady listens where a service manager would ($NOTIFY_SOCKET) and
// returns its path and a channel that gets the MAINPID of the first
// notification saying READY=1 (the daemon sends it once it serves the
// mount and the lease socket). It reads every notification until the
// test ends.
func listenReady(t *testing.T) (string, <-chan int) {
	t.Helper()
	dir, err := os.MkdirTemp("", "gdsfs-notify-") // short: a socket path is at most 107 bytes
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "notify")
	l, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		os.RemoveAll(dir)
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close(); os.RemoveAll(dir) })
	ready := make(chan int, 1)
	go func(ready chan<- int) {
		buf := make([]byte, 4096)
		for {
			n, err := l.Read(buf) // ends when the listener is closed
			if err != nil {
				return
			}
			fields := strings.Split(string(buf[:n]), "\n")
			pid := -1
			for _, f := range fields {
				if v, ok := strings.CutPrefix(f, "MAINPID="); ok {
					pid, _ = strconv.Atoi(v)
				}
			}
			if slices.Contains(fields, "READY=1") && ready != nil {
				ready <- pid
				ready = nil
			}
			// Read on, as a service manager does: a daemon waits on
			// BARRIER=1 until its message is handled (the descriptor
			// it carries is closed by the kernel as Read drops it).
		}
	}(ready)
	return path, ready
}

// stop unmounts (by SIGTERM, as a user would) and waits for a clean exit.
func (m *mount) stop() {
	if m.waiter != nil {
		m.waiter.Close()
	}
	if m.cmd.ProcessState != nil {
		return
	}
	m.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-m.exited:
		if err != nil {
			m.t.Errorf("gdsfs exited with %v\n%s", err, m.log)
		}
	case <-time.After(20 * time.Second):
		m.cmd.Process.Kill()
		mountinfo.Unmount(m.mnt, true)
		m.t.Errorf("gdsfs did not exit on SIGTERM\n%s", m.log)
	}
	if _, ok := mountinfo.MountedAt(m.mnt); ok {
		m.t.Errorf("%s still mounted after the daemon exited", m.mnt)
	}
}

// syncBuffer is a bytes.Buffer the daemon's output goroutine and the test
// may use at once.
type syncBuffer struct {
	mu    sync.Mutex
	b     bytes.Buffer
	wrote chan struct{} // closed at the next Write
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.wrote != nil {
		close(s.wrote)
		s.wrote = nil
	}
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// waitFor says whether the output holds sub within 20 s. A daemon's
// output reaches the buffer through a copying goroutine, after whatever
// the daemon did next (its READY=1, an answer): wait for a line, do not
// look for it.
func (s *syncBuffer) waitFor(sub string) bool {
	limit := time.After(20 * time.Second)
	for {
		s.mu.Lock()
		if strings.Contains(s.b.String(), sub) {
			s.mu.Unlock()
			return true
		}
		if s.wrote == nil {
			s.wrote = make(chan struct{})
		}
		wrote := s.wrote
		s.mu.Unlock()
		select {
		case <-wrote:
		case <-limit:
			return false
		}
	}
}

// path is a path inside the mount.
func (m *mount) path(rel string) string { return filepath.Join(m.mnt, rel) }

// control reads a control file.
func (m *mount) control(name string) string {
	m.t.Helper()
	b, err := os.ReadFile(m.path(".gdsfs/" + name))
	if err != nil {
		m.t.Fatalf("read .gdsfs/%s: %v", name, err)
	}
	return string(b)
}

// sh runs a bash command (dash reports every failed write as "I/O error") and returns its stdout; it fails the test on a
// non-zero exit.
func sh(t *testing.T, script string) string {
	t.Helper()
	var out, errb bytes.Buffer
	cmd := exec.Command("bash", "-ec", script)
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s: %v\n%s%s", script, err, out.String(), errb.String())
	}
	return out.String()
}

// shErr runs a shell command expected to fail and returns its stderr.
func shErr(t *testing.T, script string) string {
	t.Helper()
	var errb bytes.Buffer
	cmd := exec.Command("bash", "-c", script)
	cmd.Stderr = &errb
	if err := cmd.Run(); err == nil {
		t.Fatalf("%s: succeeded, want a failure", script)
	}
	return errb.String()
}

// randomFile writes n pseudo-random bytes.
func randomFile(t *testing.T, path string, n int, seed int) {
	t.Helper()
	os.MkdirAll(filepath.Dir(path), 0o755)
	b := make([]byte, n)
	x := uint32(seed*2654435761 + 1)
	for i := range b {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		b[i] = byte(x)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func need(t *testing.T, tools ...string) {
	t.Helper()
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is not installed (make test installs nothing; .ci/run does): %v", tool, err)
		}
	}
}
