package client

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// plantDaemon runs a fake daemon as uid 65534 listening at sock (its
// directory must let that uid in); it answers nothing and reports, on
// exit, how many bytes each connection sent it. It returns once the
// socket listens, and a function that stops it and returns that report.
func plantDaemon(t *testing.T, sock string) (stop func() string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("SKIPPED: planting a socket as uid 65534 needs root")
	}
	py := "/usr/bin/python3" // one uid 65534 may run (a pyenv shim under /root is not)
	if _, err := os.Stat(py); err != nil {
		t.Skip("SKIPPED: the planted daemon is a script for /usr/bin/python3, which is missing")
	}
	const script = `import socket, sys
s = socket.socket(socket.AF_UNIX)
s.bind(sys.argv[1])
s.listen(8)
print("ready", flush=True)
got = []
for line in sys.stdin:
    s.settimeout(0)
    try:
        while True:
            c, _ = s.accept()
            c.settimeout(None)
            n = 0
            while True:
                d = c.recv(4096)
                if not d:
                    break
                n += len(d)
            got.append(str(n))
    except BlockingIOError:
        pass
    print("got", " ".join(got), flush=True)
`
	cmd := exec.Command(py, "-c", script, sock)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	in, _ := cmd.StdinPipe()
	outp, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	out := bufio.NewReader(outp)
	if line, err := out.ReadString('\n'); line != "ready\n" {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("planted daemon: %q, %v", line, err)
	}
	var report string
	stop = func() string {
		if in != nil {
			in.Write([]byte("report\n"))
			in.Close()
			in = nil
			report, _ = out.ReadString('\n')
			cmd.Wait()
		}
		return strings.TrimSpace(report)
	}
	t.Cleanup(func() { stop() })
	return stop
}

// openDir is a directory every uid may write, removed after the test.
func openDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "gdsfs-plant-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(d, 0o777)
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// TestPlantedSocketRefused: a socket whose listener is neither root nor
// the mount's owner gets no path and no trust: Open, Stat, Wait and Dial
// refuse it (counted) after connecting, before sending anything.
func TestPlantedSocketRefused(t *testing.T) {
	dir := openDir(t)
	sock := filepath.Join(dir, "planted.sock")
	stop := plantDaemon(t, sock)
	mnt := filepath.Join(dir, "mnt")
	os.MkdirAll(filepath.Join(mnt, ".gdsfs"), 0o755)
	os.WriteFile(filepath.Join(mnt, ".gdsfs", "socket"), []byte(sock+"\n"), 0o644)
	t.Cleanup(MountinfoForTest(fakeMount(mnt))) // owned by this process's euid: root
	DropCache()
	before := Untrusted()
	check := func(what string, err error) {
		t.Helper()
		var ue *UntrustedError
		if !errors.As(err, &ue) || ue.Peer != 65534 || !errors.Is(err, syscall.EPERM) ||
			!strings.Contains(err.Error(), sock) || !strings.Contains(err.Error(), "uid 65534") {
			t.Errorf("%s through a socket of uid 65534: %v; want an UntrustedError naming it", what, err)
		}
	}
	_, err := Open(filepath.Join(mnt, "model.pt"))
	check("Open", err)
	_, err = OpenMany([]string{filepath.Join(mnt, "a"), filepath.Join(mnt, "b")})
	check("OpenMany", err)
	_, err = Stat(filepath.Join(mnt, "model.pt"))
	check("Stat", err)
	_, err = Wait(filepath.Join(mnt, "model.pt"), []string{"resident"}, 0)
	check("Wait", err)
	_, err = Dial(sock)
	check("Dial", err)
	if n := Untrusted() - before; n != 5 {
		t.Errorf("%d refusals counted, want 5", n)
	}
	if got := stop(); got != "got 0 0 0 0 0" {
		t.Errorf("the planted daemon reports %q; want 5 connections that sent nothing", got)
	}
}

// TestRootListenerRefusedForAnotherUsersMount: a mount owned by uid 65534
// (one that user made) whose .gdsfs/socket names a socket root listens on
// (the daemon of root's own mount, serving another SOURCE) gets nothing:
// its daemon runs as its owner, and root's would lease the file of the
// same relative path in its own SOURCE.
func TestRootListenerRefusedForAnotherUsersMount(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("SKIPPED: a root listener for a mount of uid 65534 needs root")
	}
	dir := t.TempDir()
	sock := filepath.Join(dir, "roots.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan int)
	go func() { // reads each connection's first line, answers nothing
		n := 0
		for {
			c, err := l.Accept()
			if err != nil {
				got <- n
				return
			}
			line, _ := bufio.NewReader(c).ReadString('\n')
			c.Close()
			n += len(line)
		}
	}()
	mnt := filepath.Join(dir, "mnt")
	os.MkdirAll(filepath.Join(mnt, ".gdsfs"), 0o755)
	os.WriteFile(filepath.Join(mnt, ".gdsfs", "socket"), []byte(sock+"\n"), 0o644)
	t.Cleanup(MountinfoForTest([]byte(fmt.Sprintf("22 1 8:1 / / rw - ext4 /dev/sda1 rw\n40 22 0:99 / %s rw - fuse.gdsfs /src rw,user_id=65534,group_id=65534\n",
		escapeMount(mnt)))))
	DropCache()
	_, err = Open(filepath.Join(mnt, "model.pt"))
	var ue *UntrustedError
	if !errors.As(err, &ue) || ue.Peer != 0 || ue.Owner != 65534 || !errors.Is(err, syscall.EPERM) {
		t.Errorf("Open through root's socket for a mount of uid 65534: %v; want an UntrustedError", err)
	}
	l.Close()
	if n := <-got; n != 0 {
		t.Errorf("root's socket was sent %d bytes", n)
	}
}

// TestOutsideMountNeverSent: with GDSFS_SOCKET set, a path under no gdsfs
// mount is refused before any connection; one under a mount is sent
// relative to it.
func TestOutsideMountNeverSent(t *testing.T) {
	root, _ := filepath.EvalSymlinks(t.TempDir())
	mnt := filepath.Join(root, "mnt")
	os.MkdirAll(filepath.Join(mnt, "d"), 0o755)
	t.Cleanup(MountinfoForTest(fakeMount(mnt)))
	t.Setenv("GDSFS_SOCKET", filepath.Join(root, "no.sock"))
	DropCache()
	for _, p := range []string{filepath.Join(root, "etc", "shadow"), "/etc/shadow"} {
		_, err := Open(p)
		var nm *NotMountedError
		if !errors.As(err, &nm) {
			t.Errorf("Open(%s) with GDSFS_SOCKET set: %v; want NotMountedError", p, err)
		}
		if _, _, err := Locate(p); !errors.As(err, &nm) {
			t.Errorf("Locate(%s) with GDSFS_SOCKET set: %v; want NotMountedError", p, err)
		}
	}
	s, rel, err := Locate(filepath.Join(mnt, "d", "f"))
	if err != nil || s != filepath.Join(root, "no.sock") || rel != "d/f" {
		t.Errorf("Locate under the mount: (%q, %q, %v), want GDSFS_SOCKET and d/f", s, rel, err)
	}
}

// TestRepointedLinkIsFollowed: after a directory link is repointed, the
// next lookup of a path through it follows the new target (another
// directory of the mount, or one on no gdsfs mount).
func TestRepointedLinkIsFollowed(t *testing.T) {
	root, _ := filepath.EvalSymlinks(t.TempDir())
	mnt := filepath.Join(root, "mnt")
	for _, d := range []string{"mnt/v1", "mnt/v2", "mnt/.gdsfs", "plain"} {
		os.MkdirAll(filepath.Join(root, d), 0o755)
	}
	os.WriteFile(filepath.Join(mnt, ".gdsfs", "socket"), []byte("/run/x.sock\n"), 0o644)
	t.Cleanup(MountinfoForTest(fakeMount(mnt)))
	latest := filepath.Join(root, "latest")
	point := func(to string) {
		tmp := latest + ".new"
		os.Remove(tmp)
		if err := os.Symlink(to, tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, latest); err != nil {
			t.Fatal(err)
		}
	}
	p := filepath.Join(latest, "ckpt.pt")
	for _, to := range []string{"mnt/v1", "mnt/v2", "mnt/v1"} {
		point(to)
		for range 2 { // the second is answered from the memory
			loc, err := locateCached(p)
			if err != nil || loc.rel != strings.TrimPrefix(to, "mnt/")+"/ckpt.pt" {
				t.Fatalf("latest -> %s: %+v, %v", to, loc, err)
			}
		}
	}
	point("plain")
	var nm *NotMountedError
	if _, err := locateCached(p); !errors.As(err, &nm) {
		t.Fatalf("latest -> a directory on no gdsfs mount: %v; want NotMountedError", err)
	}
}

// TestDialTimeout: connecting to a listener that accepts nothing, its
// backlog full, fails instead of waiting for ever.
func TestDialTimeout(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "full.sock")
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: sock}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	old := connectTimeout
	connectTimeout = 50 * time.Millisecond
	defer func() { connectTimeout = old }()
	var held []*Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	// The kernel queues backlog+1 connections; the next one cannot be.
	for i := 0; i < 3; i++ {
		c, err := Dial(sock)
		if err != nil {
			return
		}
		held = append(held, c)
	}
	t.Fatalf("%d connections to a listener with a backlog of 0 that accepts nothing", len(held))
}

// TestFileLinkOffTheMountNeverSent: a file that is a symbolic link to a
// file on no gdsfs mount is not sent by the link's name (the daemon would
// follow it beneath SOURCE, where a plain open does not go).
func TestFileLinkOffTheMountNeverSent(t *testing.T) {
	root, _ := filepath.EvalSymlinks(t.TempDir())
	mnt := filepath.Join(root, "mnt")
	os.MkdirAll(filepath.Join(mnt, "sub"), 0o755)
	os.MkdirAll(filepath.Join(root, "plain"), 0o755)
	os.WriteFile(filepath.Join(root, "plain", "pub.pt"), []byte("x"), 0o644)
	os.WriteFile(filepath.Join(mnt, "real.pt"), []byte("y"), 0o644)
	os.Symlink("../../plain/pub.pt", filepath.Join(mnt, "sub", "off.pt"))
	os.Symlink("../real.pt", filepath.Join(mnt, "sub", "on.pt"))
	t.Cleanup(MountinfoForTest(fakeMount(mnt)))
	t.Setenv("GDSFS_SOCKET", filepath.Join(root, "no.sock"))
	DropCache()
	var nm *NotMountedError
	if _, _, err := Locate(filepath.Join(mnt, "sub", "off.pt")); !errors.As(err, &nm) {
		t.Errorf("Locate of a link off the mount: %v; want NotMountedError", err)
	}
	if _, err := Open(filepath.Join(mnt, "sub", "off.pt")); !errors.As(err, &nm) {
		t.Errorf("Open of a link off the mount: %v; want NotMountedError", err)
	}
	if _, rel, err := Locate(filepath.Join(mnt, "sub", "on.pt")); err != nil || rel != "real.pt" {
		t.Errorf("Locate of a link to real.pt on the mount: (%q, %v); want real.pt", rel, err)
	}
}

// TestDialMountOfAnotherUsersMount: the daemon of a mount owned by uid
// 65534 is accepted by DialMount (root talking to another user's mount),
// still refused by Dial (root or the caller only), and nothing else is.
func TestDialMountOfAnotherUsersMount(t *testing.T) {
	dir := openDir(t)
	sock := filepath.Join(dir, "theirs.sock")
	stop := plantDaemon(t, sock)
	mnt := filepath.Join(dir, "mnt")
	os.MkdirAll(filepath.Join(mnt, ".gdsfs"), 0o755)
	os.WriteFile(filepath.Join(mnt, ".gdsfs", "socket"), []byte(sock+"\n"), 0o644)
	table := strings.Replace(string(fakeMount(mnt)), fmt.Sprintf("user_id=%d,", os.Geteuid()), "user_id=65534,", 1)
	t.Cleanup(MountinfoForTest([]byte(table)))
	DropCache()
	c, rel, err := DialMount(filepath.Join(mnt, "d", "model.pt"))
	if err != nil || rel != "d/model.pt" {
		t.Fatalf("DialMount of uid 65534's mount: (%q, %v), want its daemon and d/model.pt", rel, err)
	}
	c.Close()
	var ue *UntrustedError
	if _, err := Dial(sock); !errors.As(err, &ue) {
		t.Errorf("Dial of uid 65534's socket as root: %v; want UntrustedError", err)
	}
	if got := stop(); got != "got 0 0" {
		t.Errorf("the daemon reports %q; want 2 connections that sent nothing", got)
	}
}

// TestMountPointIsNotRememberedForItsDirectory: locating a gdsfs mount
// point remembers nothing for the directory it sits in, which is another
// filesystem's: a file there is then refused as on no gdsfs mount, not
// sent to the mount point's daemon.
func TestMountPointIsNotRememberedForItsDirectory(t *testing.T) {
	root, _ := filepath.EvalSymlinks(t.TempDir())
	mnt := filepath.Join(root, "mnt")
	os.MkdirAll(filepath.Join(mnt, ".gdsfs"), 0o755)
	os.WriteFile(filepath.Join(mnt, ".gdsfs", "socket"), []byte("/run/x.sock\n"), 0o644)
	t.Cleanup(MountinfoForTest(fakeMount(mnt)))
	if _, err := locateCached(mnt); err != nil {
		t.Fatalf("the mount point: %v", err)
	}
	var nm *NotMountedError
	for range 2 {
		if loc, err := locateCached(filepath.Join(root, "beside.pt")); !errors.As(err, &nm) {
			t.Fatalf("a file beside the mount point: %+v, %v; want NotMountedError", loc, err)
		}
	}
}

// TestMountOverAFileInARememberedDirectory: a file with another
// filesystem's file bind-mounted over it, in a directory whose daemon
// the client remembers, is looked up afresh (and refused as on no gdsfs
// mount), not sent to that daemon, whose SOURCE file is not what a plain
// open of the path reads.
func TestMountOverAFileInARememberedDirectory(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("SKIPPED: a bind mount needs root")
	}
	root, _ := filepath.EvalSymlinks(t.TempDir())
	mnt := filepath.Join(root, "mnt")
	os.MkdirAll(filepath.Join(mnt, ".gdsfs"), 0o755)
	os.MkdirAll(filepath.Join(mnt, "mo"), 0o755)
	os.WriteFile(filepath.Join(mnt, ".gdsfs", "socket"), []byte("/run/x.sock\n"), 0o644)
	a, x := filepath.Join(mnt, "mo", "a.bin"), filepath.Join(mnt, "mo", "x.bin")
	for _, p := range []string{a, x} {
		if err := os.WriteFile(p, []byte("gdsfs"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	other, err := os.CreateTemp("/dev/shm", "gdsfs-other-")
	if err != nil {
		t.Fatal(err)
	}
	other.Close()
	t.Cleanup(func() { os.Remove(other.Name()) })
	var so, sd syscall.Stat_t
	if syscall.Stat(other.Name(), &so) != nil || syscall.Stat(x, &sd) != nil || so.Dev == sd.Dev {
		t.Fatalf("this test needs /dev/shm on another filesystem than %s", root)
	}
	if err := syscall.Mount(other.Name(), x, "", syscall.MS_BIND, ""); err != nil {
		t.Fatalf("bind mount over %s: %v", x, err)
	}
	t.Cleanup(func() { syscall.Unmount(x, 0) })
	table := string(fakeMount(mnt)) + fmt.Sprintf("41 40 0:98 / %s rw - tmpfs tmpfs rw\n", escapeMount(x))
	t.Cleanup(MountinfoForTest([]byte(table)))
	if loc, err := locateCached(a); err != nil || loc.rel != "mo/a.bin" {
		t.Fatalf("a file of the mount: %+v, %v", loc, err)
	}
	var nm *NotMountedError
	if loc, err := locateCached(x); !errors.As(err, &nm) {
		t.Fatalf("a file with another filesystem's mounted over it: %+v, %v; want NotMountedError", loc, err)
	}
}
