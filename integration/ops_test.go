package integration

import (
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/internal/mountinfo"
)

// Operations: starting detached, readiness, stopping with files
// open, the mount helper and fstab, dead mounts.

// notifySocket listens where a service manager would ($NOTIFY_SOCKET) and
// returns its path and a receiver of the datagrams.
func notifySocket(t *testing.T) (string, func() string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify")
	l, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return path, func() string {
		t.Helper()
		l.SetReadDeadline(time.Now().Add(30 * time.Second))
		buf := make([]byte, 4096)
		n, err := l.Read(buf)
		if err != nil {
			t.Fatalf("no notification: %v", err)
		}
		return string(buf[:n])
	}
}

// foreground starts `gdsfs mount` with env added and returns it unwaited.
func foreground(t *testing.T, src, mnt string, env []string, sets ...string) *mount {
	t.Helper()
	needMount(t)
	args := []string{"mount", "--set", "log.format=console", "--set", "ipc.socket=" + filepath.Join(t.TempDir(), "lease.sock")}
	for _, s := range sets {
		args = append(args, "--set", s)
	}
	m := &mount{t: t, src: src, mnt: mnt, log: &syncBuffer{}, exited: make(chan error, 1)}
	m.cmd = exec.Command(bins.gdsfs, append(args, src, mnt)...)
	m.cmd.Env = append(os.Environ(), env...)
	m.cmd.Stdout, m.cmd.Stderr = m.log, m.log
	if err := m.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { m.exited <- m.cmd.Wait() }()
	t.Cleanup(func() {
		if _, ok := mountinfo.MountedAt(mnt); ok {
			mountinfo.Unmount(mnt, true)
		}
		m.cmd.Process.Kill()
	})
	return m
}

// waitExit waits for the daemon to exit and returns its error.
func (m *mount) waitExit() error {
	m.t.Helper()
	select {
	case err := <-m.exited:
		return err
	case <-time.After(60 * time.Second):
		m.t.Fatalf("gdsfs did not exit\n%s", m.log)
		return nil
	}
}

// TestReadinessNotified: under a service manager the daemon says READY=1
// only once the mount answers, and STOPPING=1 when a stop begins.
func TestReadinessNotified(t *testing.T) {
	src := sourceTree(t)
	sock, recv := notifySocket(t)
	m := foreground(t, src, t.TempDir(), []string{"NOTIFY_SOCKET=" + sock})
	if msg := recv(); !strings.HasPrefix(msg, "READY=1") {
		t.Fatalf("first notification %q, want READY=1", msg)
	}
	// No waiting: READY=1 means served.
	if got := m.control("version"); !strings.HasPrefix(got, "gdsfs ") {
		t.Fatalf(".gdsfs/version right after READY=1: %q", got)
	}
	m.cmd.Process.Signal(syscall.SIGTERM)
	if msg := recv(); !strings.HasPrefix(msg, "STOPPING=1") {
		t.Fatalf("notification on SIGTERM %q, want STOPPING=1", msg)
	}
	if err := m.waitExit(); err != nil {
		t.Fatalf("exit: %v\n%s", err, m.log)
	}
}

// TestDaemonFlag: --daemon returns once the mount is served (exit 0) or
// says why not (non-zero, the error on stderr, nothing left mounted).
func TestDaemonFlag(t *testing.T) {
	needMount(t)
	src, mnt := sourceTree(t), t.TempDir()
	sockDir := t.TempDir()
	out, err := exec.Command(bins.gdsfs, "mount", "--daemon", "--set", "ipc.socket="+filepath.Join(sockDir, "s.sock"),
		"--set", "log.file="+filepath.Join(sockDir, "log"), src, mnt).CombinedOutput()
	if err != nil {
		t.Fatalf("mount --daemon: %v\n%s", err, out)
	}
	t.Cleanup(func() { mountinfo.Unmount(mnt, true) })
	// Served on return: no waiting.
	if got, _ := os.ReadFile(filepath.Join(mnt, "hello.txt")); string(got) != "hello, gdsfs\n" {
		t.Fatalf("hello.txt right after --daemon returned: %q", got)
	}
	if err := mountinfo.Unmount(mnt, false); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, source, want string
		code               int
	}{
		{"missing SOURCE", filepath.Join(src, "nope"), "SOURCE " + filepath.Join(src, "nope") + ": no such file or directory", 2},
		{"mount point busy", src, "busy: the daemon serving it does not hand over to this one", 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			target := t.TempDir()
			if tc.name == "mount point busy" {
				target = startMount(t, sourceTree(t)).mnt
			}
			cmd := exec.Command(bins.gdsfs, "mount", "--daemon", "--set", "ipc.socket="+filepath.Join(t.TempDir(), "s.sock"), tc.source, target)
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != tc.code || !strings.Contains(string(out), tc.want) {
				t.Fatalf("got %v %q, want exit %d naming %q", err, out, tc.code, tc.want)
			}
			if strings.Count(string(out), "gdsfs: ") != 1 {
				t.Fatalf("the error is not printed exactly once: %q", out)
			}
		})
	}
}

// TestStopWithOpenFile: SIGTERM with a file open refuses new opens, lets
// the open file be read during the grace period, then detaches the mount
// and exits 0; a file closed within the grace period ends in a clean
// unmount.
func TestStopWithOpenFile(t *testing.T) {
	for _, closeIt := range []bool{false, true} {
		name := map[bool]string{false: "held past the grace period", true: "closed within it"}[closeIt]
		t.Run(name, func(t *testing.T) {
			src := sourceTree(t)
			sock, recv := notifySocket(t)
			grace := map[bool]string{false: "1s", true: "10m"}[closeIt]
			m := foreground(t, src, t.TempDir(), []string{"NOTIFY_SOCKET=" + sock}, "shutdown.grace="+grace)
			recv() // READY=1
			f, err := os.Open(m.path("data/fd.bin"))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			m.cmd.Process.Signal(syscall.SIGTERM)
			if msg := recv(); !strings.HasPrefix(msg, "STOPPING=1") {
				t.Fatalf("notification %q, want STOPPING=1", msg)
			}
			if _, err := os.Open(m.path("data/fe.bin")); !errors.Is(err, syscall.ESHUTDOWN) {
				t.Fatalf("open while stopping: %v, want ESHUTDOWN", err)
			}
			if _, err := f.ReadAt(make([]byte, 4096), 0); err != nil {
				t.Fatalf("read of the file held open while stopping: %v", err)
			}
			want := "detached the mount lazily"
			if closeIt {
				f.Close()
				want = "unmounted cleanly"
			}
			if err := m.waitExit(); err != nil {
				t.Fatalf("exit status: %v, want 0\n%s", err, m.log)
			}
			if !strings.Contains(m.log.String(), want) {
				t.Fatalf("log does not say %q:\n%s", want, m.log)
			}
			if _, ok := mountinfo.MountedAt(m.mnt); ok {
				t.Fatalf("%s still mounted", m.mnt)
			}
		})
	}
}

// TestDeadMountRecovered: after kill -9 the mount point answers ENOTCONN;
// gdsfs mount on it clears the dead mount and mounts.
func TestDeadMountRecovered(t *testing.T) {
	src := sourceTree(t)
	sock, recv := notifySocket(t)
	m := foreground(t, src, t.TempDir(), []string{"NOTIFY_SOCKET=" + sock})
	// READY=1 comes after go-fuse's mount-time probe, which opens a file in
	// the mount: a kill -9 during it leaves a daemon that cannot exit.
	recv()
	m.cmd.Process.Kill()
	<-m.exited
	if err := unix.Statfs(m.mnt, &unix.Statfs_t{}); !errors.Is(err, unix.ENOTCONN) {
		t.Fatalf("statfs of the dead mount: %v, want ENOTCONN", err)
	}
	m2 := startMountAt(t, src, m.mnt)
	if got, _ := os.ReadFile(m2.path("hello.txt")); string(got) != "hello, gdsfs\n" {
		t.Fatalf("hello.txt through the new mount: %q", got)
	}
	if !m2.log.waitFor("dead gdsfs mount") {
		t.Fatalf("the log does not say a dead mount was cleared:\n%s", m2.log)
	}
}

// installHelper makes /sbin/mount.fuse.gdsfs this test's gdsfs (where
// mount(8) looks for helpers), restoring what was there afterwards.
func installHelper(t *testing.T) {
	t.Helper()
	const p = "/sbin/mount.fuse.gdsfs"
	if target, err := os.Readlink(p); err == nil && target == bins.gdsfs {
		return
	}
	if _, err := os.Lstat(p); err == nil {
		saved := p + ".saved-by-gdsfs-test"
		if err := os.Rename(p, saved); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Rename(saved, p) })
	} else {
		t.Cleanup(func() { os.Remove(p) })
	}
	if err := os.Symlink(bins.gdsfs, p); err != nil {
		t.Fatal(err)
	}
}

// TestMountHelperAndFstab: mount -t fuse.gdsfs with -o options, and an
// fstab line through mount -a -T, map options to config keys; umount ends
// the daemon's mount.
func TestMountHelperAndFstab(t *testing.T) {
	needMount(t)
	need(t, "mount", "umount", "findmnt")
	installHelper(t)
	src := sourceTree(t)
	dir := t.TempDir()
	mnt, mnt2 := filepath.Join(dir, "m1"), filepath.Join(dir, "m2")
	os.Mkdir(mnt, 0o755)
	os.Mkdir(mnt2, 0o755)
	t.Cleanup(func() { mountinfo.Unmount(mnt, true); mountinfo.Unmount(mnt2, true) })
	sh(t, "mount -t fuse.gdsfs "+src+" "+mnt+" -o ro,allow_other,nosuid,ipc.socket="+dir+"/1.sock,staging.capacity=64MiB,log.file="+dir+"/1.log")
	cfg := readFile(t, filepath.Join(mnt, ".gdsfs/config"))
	for _, want := range []string{"allow_other: true", "capacity: 64MiB", "read_only: true"} {
		if !strings.Contains(cfg, want) {
			t.Errorf("mount -t fuse.gdsfs -o ...: config lacks %q:\n%s", want, cfg)
		}
	}
	if opts := sh(t, "findmnt -no OPTIONS "+mnt); !strings.Contains(opts, "allow_other") {
		t.Errorf("kernel mount options %q lack allow_other", opts)
	}
	if got := readFile(t, filepath.Join(mnt, "hello.txt")); got != "hello, gdsfs\n" {
		t.Errorf("hello.txt: %q", got)
	}
	if msg := shErr(t, "mount -t fuse.gdsfs "+src+" "+mnt2+" -o bogus"); !strings.Contains(msg, "-o bogus: unknown option") {
		t.Errorf("a bad option: %q", msg)
	}
	fstab := filepath.Join(dir, "fstab")
	line := src + " " + mnt2 + " fuse.gdsfs defaults,_netdev,nofail,x-systemd.automount,ipc.socket=" + dir + "/2.sock,io.num_threads=3,staging.gpus=[0] 0 0\n"
	os.WriteFile(fstab, []byte("# test\n"+line), 0o644)
	sh(t, "mount -a -T "+fstab)
	if cfg := readFile(t, filepath.Join(mnt2, ".gdsfs/config")); !strings.Contains(cfg, "num_threads: 3") {
		t.Errorf("fstab line: config lacks num_threads: 3:\n%s", cfg)
	}
	sh(t, "umount "+mnt+" && umount "+mnt2)
	for _, p := range []string{mnt, mnt2} {
		if _, ok := mountinfo.MountedAt(p); ok {
			t.Errorf("%s still mounted after umount", p)
		}
	}
}

// TestSmallCommands: --version, stats on any path under a mount, and
// stats --watch lines.
func TestSmallCommands(t *testing.T) {
	m := startMount(t, sourceTree(t))
	if out := sh(t, bins.gdsfs+" --version"); !strings.HasPrefix(out, "gdsfs ") {
		t.Errorf("--version: %q", out)
	}
	for _, p := range []string{m.mnt, m.path("data"), m.path("data/fa.bin")} {
		if out := sh(t, bins.gdsfs+" stats "+p); !strings.Contains(out, "[staging]") {
			t.Errorf("stats %s: %q", p, out)
		}
	}
	out := sh(t, bins.gdsfs+" stats --watch --interval 50ms --count 2 "+m.path("deep/er"))
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || !strings.Contains(lines[0], "opens/s") {
		t.Fatalf("stats --watch: want a header and 2 lines:\n%s", out)
	}
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestSystemdUnit: the shipped unit passes systemd-analyze verify with no
// warning (paths pointed at this test's binary and an example env file).
func TestSystemdUnit(t *testing.T) {
	need(t, "systemd-analyze")
	dir := t.TempDir()
	unit := readFile(t, "../deploy/systemd/gdsfs@.service")
	if !strings.Contains(unit, "Type=notify") || !strings.Contains(unit, "ExecStart=/usr/local/bin/gdsfs mount ") {
		t.Fatalf("the unit is not a Type=notify gdsfs mount:\n%s", unit)
	}
	unit = strings.ReplaceAll(unit, "/usr/local/bin/gdsfs", bins.gdsfs)
	unit = strings.ReplaceAll(unit, "/etc/gdsfs/%i.env", filepath.Join(dir, "example.env"))
	os.WriteFile(filepath.Join(dir, "example.env"), []byte(readFile(t, "../deploy/systemd/example.env")), 0o644)
	path := filepath.Join(dir, "gdsfs@example.service")
	os.WriteFile(path, []byte(unit), 0o644)
	out, err := exec.Command("systemd-analyze", "verify", path).CombinedOutput()
	if err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
}
