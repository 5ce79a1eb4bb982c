package integration

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/internal/mountinfo"
)

// helloTree is a SOURCE holding hello.txt only.
func helloTree(t *testing.T) string {
	t.Helper()
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "hello.txt"), []byte("hello, gdsfs\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return src
}

// detachAtCleanup detaches whatever is still mounted on mnt when the test
// ends (a daemon that died leaves a dead mount).
func detachAtCleanup(t *testing.T, mnt string) {
	t.Cleanup(func() {
		if _, ok := mountinfo.MountedAt(mnt); ok {
			unix.Unmount(mnt, unix.MNT_DETACH)
		}
	})
}

// waitFileHolds waits until the file at path contains want, woken by
// inotify events on its directory; it fails when the daemon exits first.
func waitFileHolds(t *testing.T, m *mount, path, want string) string {
	t.Helper()
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if _, err := unix.InotifyAddWatch(fd, filepath.Dir(path), unix.IN_CREATE|unix.IN_MODIFY|unix.IN_MOVED_TO); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	buf := make([]byte, 4096)
	for {
		if b, err := os.ReadFile(path); err == nil && strings.Contains(string(b), want) {
			return string(b)
		}
		select {
		case err := <-m.exited:
			m.exited <- err
			t.Fatalf("the daemon exited (%v) before %s held %q\n%s", err, path, want, m.log)
		default:
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(path)
			t.Fatalf("%s does not hold %q after 30s:\n%s", path, want, b)
		}
		// Wakes on a change in the directory; the timeout only lets the
		// loop see a daemon that died.
		unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 1000)
		for {
			if _, err := unix.Read(fd, buf); err != nil {
				break
			}
		}
	}
}

// TestHangupReopensLog: SIGHUP makes the daemon reopen log.file (after
// log rotation renamed it) and nothing else: the mount keeps serving.
func TestHangupReopensLog(t *testing.T) {
	needMount(t)
	logPath := filepath.Join(t.TempDir(), "gdsfs.log")
	m := startMount(t, helloTree(t), "log.file="+logPath)
	detachAtCleanup(t, m.mnt)
	if err := os.Rename(logPath, logPath+".1"); err != nil {
		t.Fatal(err)
	}
	if err := m.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitFileHolds(t, m, logPath, "reopened log.file")
	if got := readFile(t, m.path("hello.txt")); got != "hello, gdsfs\n" {
		t.Fatalf("hello.txt through the mount after SIGHUP: %q", got)
	}
	if old := readFile(t, logPath+".1"); !strings.Contains(old, "mounted") || strings.Contains(old, "reopened") {
		t.Errorf("the rotated log should end before the hangup:\n%s", old)
	}
	wantMode(t, logPath, 0o600)
}

// TestLogFilePrivate: log.file is created 0600; an existing file loses
// others' access; a symbolic link there is refused, its target untouched.
func TestLogFilePrivate(t *testing.T) {
	needMount(t)
	dir := t.TempDir()
	src := helloTree(t)
	created := filepath.Join(dir, "created.log")
	startMount(t, src, "log.file="+created)
	wantMode(t, created, 0o600)

	existing := filepath.Join(dir, "existing.log")
	os.WriteFile(existing, []byte("before\n"), 0o644)
	os.Chmod(existing, 0o644)
	startMount(t, src, "log.file="+existing)
	wantMode(t, existing, 0o640) // others' access removed

	target, link := filepath.Join(dir, "target"), filepath.Join(dir, "link.log")
	os.WriteFile(target, nil, 0o644)
	os.Chmod(target, 0o644)
	os.Symlink(target, link)
	mnt := t.TempDir()
	m := foreground(t, src, mnt, nil, "log.file="+link)
	if err := m.waitExit(); err == nil {
		t.Fatalf("a log.file that is a symbolic link was accepted\n%s", m.log)
	}
	if !strings.Contains(m.log.String(), "symbolic link") {
		t.Errorf("the error does not say the log file is a symbolic link:\n%s", m.log)
	}
	wantMode(t, target, 0o644)
	if st, err := os.Stat(target); err != nil || st.Size() != 0 {
		t.Errorf("the link's target was written to: %v", err)
	}
}

func wantMode(t *testing.T, path string, want os.FileMode) {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != want {
		t.Errorf("%s: mode %v, want %v", path, st.Mode().Perm(), want)
	}
}

// mountOptions returns the per-mount options of mnt in
// /proc/self/mountinfo (field 6).
func mountOptions(t *testing.T, mnt string) []string {
	t.Helper()
	for _, l := range strings.Split(readFile(t, "/proc/self/mountinfo"), "\n") {
		f := strings.Fields(l)
		if len(f) > 5 && f[4] == mnt {
			return strings.Split(f[5], ",")
		}
	}
	t.Fatalf("%s not in /proc/self/mountinfo", mnt)
	return nil
}

func hasAll(have []string, want ...string) bool {
	for _, w := range want {
		found := false
		for _, h := range have {
			found = found || h == w
		}
		if !found {
			return false
		}
	}
	return true
}

// TestMountFlagsApplied: the helper's -o ro and noexec become kernel mount
// flags (with nosuid and nodev, always set): a read-only mount refuses
// writes in the kernel, control files included.
func TestMountFlagsApplied(t *testing.T) {
	needMount(t)
	need(t, "mount", "umount")
	installHelper(t)
	src, dir := helloTree(t), t.TempDir()
	mnt := filepath.Join(dir, "m")
	os.Mkdir(mnt, 0o755)
	t.Cleanup(func() { mountinfo.Unmount(mnt, true) })
	sh(t, "mount -t fuse.gdsfs "+src+" "+mnt+" -o ro,noexec,ipc.socket="+dir+"/s.sock,log.file="+dir+"/log")
	if opts := mountOptions(t, mnt); !hasAll(opts, "ro", "noexec", "nosuid", "nodev") {
		t.Errorf("-o ro,noexec: mount options %q, want ro, noexec, nosuid, nodev", opts)
	}
	if err := os.WriteFile(filepath.Join(mnt, "new"), nil, 0o644); !errors.Is(err, syscall.EROFS) {
		t.Errorf("create on a ro mount: %v, want EROFS", err)
	}
	if f, err := os.OpenFile(filepath.Join(mnt, ".gdsfs/prefetch"), os.O_WRONLY, 0); !errors.Is(err, syscall.EROFS) {
		t.Errorf("a control file on a ro mount: %v, want EROFS", err)
		if err == nil {
			f.Close()
		}
	}
	if got := readFile(t, filepath.Join(mnt, "hello.txt")); got != "hello, gdsfs\n" {
		t.Errorf("hello.txt: %q", got)
	}
	sh(t, "umount "+mnt)

	m := startMount(t, src, "fuse.mount_flags=[noexec]")
	if opts := mountOptions(t, m.mnt); !hasAll(opts, "rw", "noexec", "nosuid", "nodev") {
		t.Errorf("fuse.mount_flags=[noexec]: mount options %q, want rw, noexec, nosuid, nodev", opts)
	}
}
