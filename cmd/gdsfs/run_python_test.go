package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs"
	"github.com/gdsfs/gdsfs/python"
)

// The test binary doubles as gdsfs (GDSFS_TEST_AS_GDSFS=1) and as the
// hostile user's tool that plants a Python package (GDSFS_TEST_PLANT=DIR).
func TestMain(m *testing.M) {
	if dir := os.Getenv("GDSFS_TEST_PLANT"); dir != "" {
		if err := plantPackage(dir, os.Getenv("GDSFS_TEST_MARKER")); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	if os.Getenv("GDSFS_TEST_AS_GDSFS") == "1" {
		main()
		return
	}
	os.Exit(m.Run())
}

// plantPackage writes into dir a Python package that looks like gdsfs's
// and appends its file name to marker from every module Python could run.
func plantPackage(dir, marker string) error {
	code := fmt.Sprintf("open(%q, 'a').write(__file__ + '\\n')\n", marker)
	for _, f := range []string{"sitecustomize.py", "gdsfs/__init__.py", "gdsfs/_bootstrap/__init__.py",
		"gdsfs/_bootstrap/boot.py", "gdsfs/_bootstrap/sitecustomize.py"} {
		p := filepath.Join(dir, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, []byte(code), 0o644); err != nil {
			return err
		}
	}
	return nil
}

const (
	attacker = 65534
	victim   = 65533
)

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("SKIPPED: needs root, to act as other uids (CI runs as root)")
	}
}

func as(uid int) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
}

// sharedTree is a directory every uid may search, removed at the end,
// holding tmp/ made like /tmp (root's, mode 1777) and bin/gdsfs, this
// test binary (mode 0755), unless bindir names another place for it
// (relative to the directory).
func sharedTree(t *testing.T, bindir string) (base, tmp, bin string) {
	t.Helper()
	base, err := os.MkdirTemp("", "gdsfs-run-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	tmp = filepath.Join(base, "tmp")
	bin = filepath.Join(base, bindir, "gdsfs")
	for _, d := range []string{tmp, filepath.Dir(bin)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for d, mode := range map[string]os.FileMode{base: 0o755, tmp: 0o777 | os.ModeSticky} {
		if err := os.Chmod(d, mode); err != nil {
			t.Fatal(err)
		}
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	copyFile(t, exe, bin, 0o755)
	return base, tmp, bin
}

func copyFile(t *testing.T, src, dst string, mode os.FileMode) {
	t.Helper()
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}

// plantAs has uid plant a package in dir (see plantPackage).
func plantAs(t *testing.T, bin string, uid int, dir, marker string) {
	t.Helper()
	cmd := exec.Command(bin)
	cmd.Env = []string{"GDSFS_TEST_PLANT=" + dir, "GDSFS_TEST_MARKER=" + marker}
	cmd.SysProcAttr = as(uid)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("uid %d planting %s: %v\n%s", uid, dir, err, out)
	}
}

// gdsfsRun runs `bin run -- python3 -c CODE` as uid (-1: this process's)
// with env, and returns its stdout and stderr; it fails t unless it exits 0.
func gdsfsRun(t *testing.T, bin string, uid int, env []string, code string) (string, string) {
	t.Helper()
	if _, err := os.Stat("/usr/bin/python3"); err != nil {
		t.Fatalf("no python3 to run: %v", err)
	}
	cmd := exec.Command(bin, "run", "--", "/usr/bin/python3", "-c", code)
	cmd.Env = append([]string{"GDSFS_TEST_AS_GDSFS=1", "PATH=/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE=1"}, env...)
	if uid >= 0 {
		cmd.SysProcAttr = as(uid)
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("gdsfs run as uid %d: %v\nstdout: %s\nstderr: %s", uid, err, out.String(), errb.String())
	}
	return out.String(), errb.String()
}

const printPackage = "import gdsfs; print(gdsfs.__file__)"

func noMarker(t *testing.T, marker string) {
	t.Helper()
	if b, err := os.ReadFile(marker); err == nil {
		t.Fatalf("the planted package ran:\n%s", b)
	}
}

// A binary in a shared directory like /tmp/X/ must not load the package
// another user planted in /tmp/python.
func TestRunRefusesPlantedPackage(t *testing.T) {
	needRoot(t)
	base, tmp, bin := sharedTree(t, "tmp/X")
	planted := filepath.Join(tmp, "python")
	marker := filepath.Join(tmp, "planted-ran")
	plantAs(t, bin, attacker, planted, marker)
	home := filepath.Join(base, "home")
	if err := os.Mkdir(home, 0o700); err != nil {
		t.Fatal(err)
	}
	stdout, stderr := gdsfsRun(t, bin, -1, []string{"HOME=" + home, "TMPDIR=" + tmp}, printPackage)
	noMarker(t, marker)
	if !strings.Contains(stderr, planted) || !strings.Contains(stderr, "owned by uid 65534") || strings.Count(stderr, "\n") != 1 {
		t.Errorf("stderr does not say, in one line, that %s was refused and why:\n%s", planted, stderr)
	}
	if !strings.HasPrefix(stdout, filepath.Join(home, ".cache", "gdsfs", "python-")) {
		t.Errorf("gdsfs was imported from %s, not from the built-in copy under %s", stdout, home)
	}
}

// The package beside the binary is used when only root and the caller
// can change it.
func TestRunUsesTrustedPackage(t *testing.T) {
	needRoot(t)
	base, tmp, bin := sharedTree(t, "inst/bin")
	pydir := filepath.Join(base, "inst", "python")
	if _, err := unpackPython(python.Files, filepath.Join(base, "unpack"), "test"); err != nil {
		t.Fatal(err)
	}
	unpacked, err := filepath.Glob(filepath.Join(base, "unpack", "python-test-*"))
	if err != nil || len(unpacked) != 1 {
		t.Fatalf("unpacked: %v %v", unpacked, err)
	}
	if err := os.Rename(unpacked[0], pydir); err != nil {
		t.Fatal(err)
	}
	stdout, stderr := gdsfsRun(t, bin, -1, []string{"HOME=" + base, "TMPDIR=" + tmp}, printPackage)
	if want := filepath.Join(pydir, "gdsfs", "__init__.py"); strings.TrimSpace(stdout) != want || stderr != "" {
		t.Errorf("gdsfs from %q (stderr %q), want %s", stdout, stderr, want)
	}
}

// An arbitrary uid whose HOME exists but is not writable (a pod's) runs;
// a per-uid directory another user made first under $TMPDIR is not used.
func TestRunWithoutWritableHome(t *testing.T) {
	needRoot(t)
	base, tmp, bin := sharedTree(t, "bin")
	home := filepath.Join(base, "home") // root's, 0755
	if err := os.Mkdir(home, 0o755); err != nil {
		t.Fatal(err)
	}
	env := []string{"HOME=" + home, "TMPDIR=" + tmp}
	stdout, stderr := gdsfsRun(t, bin, victim, env, printPackage)
	if want := filepath.Join(tmp, fmt.Sprintf("gdsfs-run-%d", victim), "python-"); !strings.HasPrefix(stdout, want) || stderr != "" {
		t.Errorf("gdsfs from %q (stderr %q), want under %s", stdout, stderr, want)
	}

	// Another uid made the victim's per-uid directory, with the package.
	sum, err := contentHash(python.Files)
	if err != nil {
		t.Fatal(err)
	}
	theirs := filepath.Join(tmp, fmt.Sprintf("gdsfs-run-%d", victim+100))
	marker := filepath.Join(tmp, "planted-ran")
	plantAs(t, bin, attacker, filepath.Join(theirs, fmt.Sprintf("python-%s-%s", sanitize(gdsfs.Version), sum)), marker)
	uid := victim + 100
	stdout, stderr = gdsfsRun(t, bin, uid, env, printPackage)
	noMarker(t, marker)
	if !strings.Contains(stderr, theirs) || !strings.Contains(stderr, "owned by uid 65534") || strings.Count(stderr, "\n") != 1 {
		t.Errorf("stderr does not say, in one line, that %s was refused and why:\n%s", theirs, stderr)
	}
	if want := filepath.Join(tmp, fmt.Sprintf("gdsfs-run-%d-", uid)); !strings.HasPrefix(stdout, want) {
		t.Errorf("gdsfs from %q, want a new directory %s*", stdout, want)
	}
}

// A daemon of the same uid keeps its socket in $TMPDIR/gdsfs-UID, 0711 so
// that other users reach the socket: gdsfs run unpacks elsewhere, once,
// with nothing to say.
func TestRunBesideADaemonsSocketDir(t *testing.T) {
	needRoot(t)
	base, tmp, bin := sharedTree(t, "bin")
	home := filepath.Join(base, "home") // root's, 0755: not writable by the victim
	if err := os.Mkdir(home, 0o755); err != nil {
		t.Fatal(err)
	}
	sockDir := filepath.Join(tmp, fmt.Sprintf("gdsfs-%d", victim))
	if err := os.Mkdir(sockDir, 0o711); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(sockDir, victim, victim); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(sockDir, 0o711); err != nil {
		t.Fatal(err)
	}
	env := []string{"HOME=" + home, "TMPDIR=" + tmp}
	want := filepath.Join(tmp, fmt.Sprintf("gdsfs-run-%d", victim), "python-")
	for i := 0; i < 2; i++ {
		stdout, stderr := gdsfsRun(t, bin, victim, env, printPackage)
		if !strings.HasPrefix(stdout, want) || stderr != "" {
			t.Errorf("run %d: gdsfs from %q (stderr %q), want under %s and nothing on stderr", i, stdout, stderr, want)
		}
	}
}

func TestTrustedPackage(t *testing.T) {
	needRoot(t)
	base, _, _ := sharedTree(t, "bin")
	pkg := func(parts ...string) string {
		d := filepath.Join(append([]string{base}, parts...)...)
		if err := plantPackage(d, "/nonexistent"); err != nil {
			t.Fatal(err)
		}
		return d
	}
	chown := func(p string, uid int) {
		if err := os.Lchown(p, uid, uid); err != nil {
			t.Fatal(err)
		}
	}
	chmod := func(p string, mode os.FileMode) {
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
	}
	mkdir := func(p string, mode os.FileMode) string {
		p = filepath.Join(base, p)
		if err := os.Mkdir(p, 0o700); err != nil {
			t.Fatal(err)
		}
		chmod(p, mode)
		return p
	}
	mkdir("open", 0o777)
	mkdir("sticky", 0o777|os.ModeSticky)
	mkdir("sticky/theirs", 0o755)
	chown(filepath.Join(base, "sticky/theirs"), attacker)
	ok := pkg("ok", "python")
	if err := os.Symlink(ok, filepath.Join(base, "link-ok")); err != nil {
		t.Fatal(err)
	}
	openPkg := pkg("open", "python")
	if err := os.Symlink(openPkg, filepath.Join(base, "link-open")); err != nil {
		t.Fatal(err)
	}
	owned := pkg("owned", "python")
	chown(filepath.Join(owned, "gdsfs", "__init__.py"), attacker)
	groupw := pkg("groupw", "python")
	chmod(filepath.Join(groupw, "gdsfs", "_bootstrap"), 0o775)
	otherw := pkg("otherw", "python")
	chmod(filepath.Join(otherw, "sitecustomize.py"), 0o646)
	link := pkg("innerlink", "python")
	if err := os.Symlink("/etc", filepath.Join(link, "gdsfs", "etc")); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		dir, why string // why: "" for trusted, else a part of the refusal
	}{
		{ok, ""},
		{filepath.Join(base, "link-ok"), ""},
		{pkg("sticky", "python"), ""},
		{pkg("sticky", "theirs", "python"), "theirs is owned by uid 65534"},
		{openPkg, "open is writable by others"},
		{filepath.Join(base, "link-open"), "open is writable by others"},
		{owned, "__init__.py is owned by uid 65534"},
		{groupw, "_bootstrap is writable by its group"},
		{otherw, "sitecustomize.py is writable by others"},
		{link, "etc is a symbolic link"},
	} {
		real, err := trustedPackage(tc.dir)
		switch {
		case tc.why == "" && err != nil:
			t.Errorf("%s refused: %v", tc.dir, err)
		case tc.why == "" && real != ok && !strings.HasPrefix(real, base+"/sticky"):
			t.Errorf("%s: real path %s", tc.dir, real)
		case tc.why != "" && (err == nil || !strings.Contains(err.Error(), tc.why)):
			t.Errorf("%s: got %v, want an error saying %q", tc.dir, err, tc.why)
		}
	}
}

func TestPrivateDir(t *testing.T) {
	needRoot(t)
	base, tmp, _ := sharedTree(t, "bin")
	mk := func(p string, mode os.FileMode, uid int) string {
		p = filepath.Join(base, p)
		if err := os.Mkdir(p, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Lchown(p, uid, uid); err != nil {
			t.Fatal(err)
		}
		return p
	}
	link := func(name, target string, uid int) string {
		p := filepath.Join(tmp, name)
		if err := os.Symlink(target, p); err != nil {
			t.Fatal(err)
		}
		if err := os.Lchown(p, uid, uid); err != nil {
			t.Fatal(err)
		}
		return p
	}
	mine := mk("mine", 0o700, 0)
	open := mk("open", 0o777, 0)
	for _, tc := range []struct {
		root, why string // why: "" when it is private, else a part of the refusal
	}{
		{filepath.Join(tmp, "new", "gdsfs"), ""},
		{mine, ""},
		{link("mylink", mine, 0), ""},
		{mk("searchable", 0o755, 0), "mode 0755"},
		{mk("theirs", 0o700, attacker), "owned by uid 65534"},
		{link("theirlink", mine, attacker), "symbolic link another user made"},
		{filepath.Join(open, "gdsfs"), "open is writable by others"},
	} {
		real, err := privateDir(tc.root)
		switch {
		case tc.why == "" && err != nil:
			t.Errorf("%s refused: %v", tc.root, err)
		case tc.why == "":
			if st, err := os.Lstat(real); err != nil || st.Mode().Perm() != 0o700 || !st.IsDir() {
				t.Errorf("%s: real path %s: %v %v", tc.root, real, st.Mode(), err)
			}
		case err == nil || !strings.Contains(err.Error(), tc.why):
			t.Errorf("%s: got %v, want an error saying %q", tc.root, err, tc.why)
		}
	}
}

func TestFuseOwner(t *testing.T) {
	info := []string{
		"22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw",
		"90 22 0:52 / /tmp/evil rw,nosuid,nodev,relatime shared:40 - fuse.sshfs u@h: rw,user_id=65534,group_id=65534,allow_other",
		"91 22 0:53 / /mnt/gdsfs rw,nosuid,nodev - fuse.gdsfs /src rw,user_id=0,group_id=0,allow_other",
		fmt.Sprintf("92 22 0:54 / /run/user/x rw - fuse /src rw,user_id=%d,group_id=0", os.Geteuid()),
		"93 22 0:55 / /odd rw - fuseblk /dev/sdb rw,default_permissions",
	}
	for _, tc := range []struct {
		dev uint32
		why string
	}{
		{1, ""}, // 8:1, not FUSE
		{52, "mounted by uid 65534"},
		{53, ""},
		{54, ""},
		{55, "unknown owner"},
		{56, ""}, // not in the table
	} {
		dev := unix.Mkdev(0, tc.dev)
		if tc.dev == 1 {
			dev = unix.Mkdev(8, 1)
		}
		err := fuseOwner(info, dev, "/x")
		if (tc.why == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.why)) {
			t.Errorf("device %d: got %v, want %q", tc.dev, err, tc.why)
		}
	}
}
