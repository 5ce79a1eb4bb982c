package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/posixtest"
	"golang.org/x/sys/unix"
)

// sourceTree makes a SOURCE with files of awkward sizes, nested
// directories, a symlink, modes and an xattr.
func sourceTree(t *testing.T) string {
	t.Helper()
	src := t.TempDir()
	for i, n := range []int{0, 1, 4095, 4096, 131073, 1<<20 + 17, 9 << 20} {
		randomFile(t, filepath.Join(src, "data", "f"+string(rune('a'+i))+".bin"), n, i)
	}
	randomFile(t, filepath.Join(src, "deep/er/still/x.txt"), 1234, 9)
	os.WriteFile(filepath.Join(src, "hello.txt"), []byte("hello, gdsfs\n"), 0o640)
	os.Symlink("hello.txt", filepath.Join(src, "link"))
	os.Chmod(filepath.Join(src, "deep/er"), 0o750)
	need(t, "setfattr")
	if out, err := exec.Command("setfattr", "-n", "user.origin", "-v", "source", filepath.Join(src, "hello.txt")).CombinedOutput(); err != nil {
		t.Fatalf("setfattr on SOURCE (the tests need user xattrs on the temporary directory's filesystem): %v %s", err, out)
	}
	return src
}

// TestToolsSeeSOURCE: unmodified tools read the same bytes and metadata
// through the mount as from SOURCE, with and without passthrough.
func TestToolsSeeSOURCE(t *testing.T) {
	need(t, "cat", "cp", "dd", "sha256sum", "find", "ls", "python3", "getfattr", "stat")
	for _, pt := range []string{"auto", "off"} {
		t.Run("passthrough="+pt, func(t *testing.T) {
			src := sourceTree(t)
			m := startMount(t, src, "fuse.passthrough="+pt)
			var stats map[string]any
			json.Unmarshal([]byte(m.control("stats.json")), &stats)
			t.Logf("passthrough %v (%v)", stats["passthrough"], stats["passthrough_reason"])
			if pt == "off" && stats["passthrough"] != false {
				t.Fatalf("passthrough off but stats say %v", stats["passthrough"])
			}
			tmp := t.TempDir()
			sum := func(dir string) string {
				return sh(t, "cd "+dir+" && find . -type f -print0 | sort -z | xargs -0 sha256sum")
			}
			if a, b := sum(src), sum(m.mnt); a != b {
				t.Fatalf("sha256sum differs:\n%s\n---\n%s", a, b)
			}
			list := func(dir string) string {
				return sh(t, "cd "+dir+" && find . -printf '%p %y %s %m %U %G %T@ %l\\n' | sort")
			}
			if a, b := list(src), list(m.mnt); a != b {
				t.Fatalf("find metadata differs:\n%s\n---\n%s", a, b)
			}
			lsR := func(dir string) string {
				return sh(t, "cd "+dir+" && ls -lRn --time-style=full-iso .")
			}
			if a, b := lsR(src), lsR(m.mnt); a != b {
				t.Fatalf("ls -lR differs:\n%s\n---\n%s", a, b)
			}
			big := "data/fg.bin"
			sh(t, "cat "+m.path(big)+" > "+tmp+"/cat.out && cp "+m.path(big)+" "+tmp+"/cp.out && "+
				"dd if="+m.path(big)+" of="+tmp+"/dd.out bs=1M status=none && "+
				"dd if="+m.path(big)+" of="+tmp+"/dd-odd.out bs=12345 skip=3 status=none && "+
				"dd if="+filepath.Join(src, big)+" of="+tmp+"/dd-odd.want bs=12345 skip=3 status=none")
			want := sh(t, "sha256sum < "+filepath.Join(src, big))
			for _, f := range []string{"cat.out", "cp.out", "dd.out"} {
				if got := sh(t, "sha256sum < "+tmp+"/"+f); got != want {
					t.Errorf("%s differs from SOURCE", f)
				}
			}
			if sh(t, "sha256sum < "+tmp+"/dd-odd.out") != sh(t, "sha256sum < "+tmp+"/dd-odd.want") {
				t.Error("dd with an odd block size and skip differs")
			}
			py := `import hashlib,sys; print(hashlib.sha256(open(sys.argv[1],'rb').read()).hexdigest())`
			if a, b := sh(t, "python3 -c \""+py+"\" "+filepath.Join(src, big)), sh(t, "python3 -c \""+py+"\" "+m.path(big)); a != b {
				t.Error("python open().read() differs")
			}
			if got := sh(t, "readlink "+m.path("link")); got != "hello.txt\n" {
				t.Errorf("readlink = %q", got)
			}
			if got := sh(t, "cat "+m.path("link")); got != "hello, gdsfs\n" {
				t.Errorf("cat through the symlink = %q", got)
			}
			// Only what cannot change while the test runs: free counts
			// belong to every writer of SOURCE's filesystem.
			statfs := "stat -f -c 'blocks %b bsize %s frsize %S inodes %c namelen %l' "
			if a, b := sh(t, statfs+src), sh(t, statfs+m.mnt); a != b {
				t.Errorf("statfs differs: %q vs %q", a, b)
			}
			if got := sh(t, "getfattr --only-values -n user.origin "+m.path("hello.txt")); got != "source" {
				t.Errorf("xattr through the mount = %q", got)
			}
			if pt == "off" {
				var after map[string]any
				json.Unmarshal([]byte(m.control("stats.json")), &after)
				if after["reads_served"].(float64) == 0 {
					t.Error("passthrough off, yet the daemon served no reads")
				}
			}
		})
	}
}

// TestReadOnly: the default mount refuses every change with EROFS and
// leaves SOURCE untouched, while the control files stay writable.
func TestReadOnly(t *testing.T) {
	need(t, "setfattr", "truncate")
	src := sourceTree(t)
	m := startMount(t, src)
	before := sh(t, "cd "+src+" && find . -printf '%p %s %T@\\n' | sort && find . -type f -print0 | sort -z | xargs -0 sha256sum")
	for _, cmd := range []string{
		"echo x > " + m.path("hello.txt"),
		"echo x >> " + m.path("hello.txt"),
		"touch " + m.path("new"),
		"rm " + m.path("hello.txt"),
		"mkdir " + m.path("d2"),
		"rmdir " + m.path("deep/er/still"),
		"mv " + m.path("hello.txt") + " " + m.path("moved"),
		"truncate -s 0 " + m.path("hello.txt"),
		"chmod 600 " + m.path("hello.txt"),
		"ln -s x " + m.path("l2"),
		"ln " + m.path("hello.txt") + " " + m.path("h2"),
		"setfattr -n user.x -v y " + m.path("hello.txt"),
	} {
		if msg := shErr(t, cmd); !strings.Contains(msg, "Read-only file system") {
			t.Errorf("%s: %q, want EROFS", cmd, msg)
		}
	}
	// Ioctls run with the daemon's privileges: only getters pass.
	if _, err := exec.LookPath("chattr"); err == nil {
		if msg := shErr(t, "chattr +d "+m.path("hello.txt")); !strings.Contains(msg, "not supported") {
			t.Errorf("chattr through a read-only mount: %q, want ENOTTY", msg)
		}
		if got := sh(t, "lsattr "+m.path("hello.txt")+" | cut -d' ' -f1"); got != sh(t, "lsattr "+filepath.Join(src, "hello.txt")+" | cut -d' ' -f1") {
			t.Errorf("lsattr through the mount = %q", got)
		}
	}
	if after := sh(t, "cd "+src+" && find . -printf '%p %s %T@\\n' | sort && find . -type f -print0 | sort -z | xargs -0 sha256sum"); after != before {
		t.Fatalf("SOURCE changed under a read-only mount")
	}
	if err := os.WriteFile(m.path(".gdsfs/prefetch"), []byte("hello.txt\n"), 0); err != nil {
		t.Fatalf("control file not writable on a read-only mount: %v", err)
	}
}

// TestReadWrite: with fuse.read_only=false changes pass through to SOURCE.
func TestReadWrite(t *testing.T) {
	src := sourceTree(t)
	orig := map[string][]byte{}
	for _, rel := range []string{"data/fb.bin", "data/fd.bin"} {
		orig[rel], _ = os.ReadFile(filepath.Join(src, rel))
	}
	m := startMount(t, src, "fuse.read_only=false")
	sh(t, "echo new > "+m.path("n.txt")+" && echo more >> "+m.path("n.txt")+" && mkdir "+m.path("d")+
		" && mv "+m.path("n.txt")+" "+m.path("d/m.txt")+" && rm "+m.path("hello.txt")+
		" && truncate -s 3 "+m.path("data/fd.bin")+" && truncate -s 5000 "+m.path("data/fb.bin")+
		" && dd if=/dev/zero of="+m.path("data/fc.bin")+" bs=1 count=10 seek=100 conv=notrunc status=none")
	for _, cmd := range []string{"mkdir " + m.path(".gdsfs/x"), "mv " + m.path("d") + " " + m.path(".gdsfs"), "rm -rf " + m.path(".gdsfs")} {
		shErr(t, cmd) // the control directory is not SOURCE's to change
	}
	if m.control("version") == "" {
		t.Fatal("the control directory went away")
	}
	if b, _ := os.ReadFile(filepath.Join(src, "d/m.txt")); string(b) != "new\nmore\n" {
		t.Errorf("SOURCE d/m.txt = %q", b)
	}
	if _, err := os.Stat(filepath.Join(src, "hello.txt")); !os.IsNotExist(err) {
		t.Errorf("unlink did not reach SOURCE: %v", err)
	}
	// Both sizes differ from the originals (4096 and 1 bytes).
	if b, err := os.ReadFile(filepath.Join(src, "data/fd.bin")); err != nil || !bytes.Equal(b, orig["data/fd.bin"][:3]) {
		t.Errorf("truncate -s 3 did not reach SOURCE: %d bytes, %v", len(b), err)
	}
	if b, err := os.ReadFile(filepath.Join(src, "data/fb.bin")); err != nil ||
		!bytes.Equal(b, append(orig["data/fb.bin"], make([]byte, 4999)...)) {
		t.Errorf("truncate -s 5000 did not reach SOURCE: %d bytes, %v", len(b), err)
	}
	b, _ := os.ReadFile(filepath.Join(src, "data/fc.bin"))
	if len(b) != 4095 || string(b[100:110]) != string(make([]byte, 10)) {
		t.Errorf("write at an offset: len %d", len(b))
	}
}

// TestPosixSuite runs go-fuse's posixtest against a read-write mount. The
// tests left out do not apply to a mirror of SOURCE, and say why.
func TestPosixSuite(t *testing.T) {
	src := t.TempDir()
	m := startMount(t, src, "fuse.read_only=false")
	notApplicable := map[string]string{
		"FcntlFlockLocksFile": "go-fuse's own suite skips it (marked TODO upstream)",
		"OpenSymlinkRace":     "go-fuse's own suite skips it: races rename against open for minutes",
	}
	for name, fn := range posixtest.All {
		t.Run(name, func(t *testing.T) {
			if why, ok := notApplicable[name]; ok {
				t.Skip("not applicable: " + why)
			}
			dir := filepath.Join(m.mnt, name)
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			fn(t, dir)
		})
	}
}

// TestBadInput: bad configuration and bad paths exit non-zero with one
// line that names the key or path.
func TestBadInput(t *testing.T) {
	needMount(t)
	src := t.TempDir()
	busy := startMount(t, t.TempDir())
	linkToBusy := filepath.Join(t.TempDir(), "link")
	os.Symlink(busy.mnt, linkToBusy)
	cfg := filepath.Join(t.TempDir(), "bad.yaml")
	os.WriteFile(cfg, []byte("staging:\n  capasity: 1GiB\n"), 0o644)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"mount", "--set", "fuse.bogus=1", src, t.TempDir()}, "unknown key fuse.bogus"},
		{[]string{"mount", "--set", "staging.capacity=lots", src, t.TempDir()}, "staging.capacity: bad size"},
		{[]string{"mount", "--set", "fuse.passthrough=sometimes", src, t.TempDir()}, "fuse.passthrough"},
		{[]string{"mount", "--config", cfg, src, t.TempDir()}, "unknown key staging.capasity"},
		{[]string{"mount", "--config", "/nonexistent.yaml", src, t.TempDir()}, "/nonexistent.yaml"},
		{[]string{"mount", "/nonexistent-source", t.TempDir()}, "SOURCE /nonexistent-source: no such file or directory"},
		{[]string{"mount", src, "/nonexistent-mnt"}, "MOUNTPOINT /nonexistent-mnt: no such file or directory"},
		{[]string{"mount", src, busy.mnt}, "MOUNTPOINT " + busy.mnt + ": busy"},
		{[]string{"mount", src, linkToBusy}, "MOUNTPOINT " + linkToBusy + ": busy"},
		{[]string{"mount", src, filepath.Join(src)}, "inside SOURCE"},
		{[]string{"mount", src}, "want 2 arguments"},
		{[]string{"umount", src}, "not a mount point"},
		{[]string{"stats", src}, "not a gdsfs mount"},
	} {
		// A mount that wrongly comes up serves until SIGTERM: bound it.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		cmd := exec.CommandContext(ctx, bins.gdsfs, tc.args...)
		cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
		out, err := cmd.CombinedOutput()
		timedOut := ctx.Err() == context.DeadlineExceeded
		cancel()
		msg := strings.TrimSpace(string(out))
		if timedOut {
			t.Errorf("gdsfs %v did not exit within 10s (it mounted?): %s", tc.args, msg)
			continue
		}
		if err == nil {
			t.Errorf("gdsfs %v succeeded, want an error", tc.args)
			continue
		}
		if !strings.Contains(msg, tc.want) || strings.Count(msg, "\n") > 0 {
			t.Errorf("gdsfs %v: %q, want one line containing %q", tc.args, msg, tc.want)
		}
	}
}

// TestStatsCountOpens: every open of a regular file is counted, and
// stats, stats.json and `gdsfs stats` agree.
func TestStatsCountOpens(t *testing.T) {
	src := sourceTree(t)
	m := startMount(t, src, "staging.prefetch=manual")
	var before map[string]any
	json.Unmarshal([]byte(m.control("stats.json")), &before)
	for range 5 {
		f, err := os.Open(m.path("hello.txt"))
		if err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	os.ReadFile(m.path("data/fa.bin"))
	os.ReadDir(m.path("data")) // directories are not counted
	var after map[string]any
	out, err := exec.Command(bins.gdsfs, "stats", "--json", m.mnt).Output()
	if err != nil {
		t.Fatal(err)
	}
	json.Unmarshal(out, &after)
	if d := after["opens"].(float64) - before["opens"].(float64); d != 6 {
		t.Fatalf("opens went up by %v, want 6", d)
	}
	for _, k := range []string{"opens", "prefetches", "staged_files", "bytes_cufile", "bytes_posix", "bytes_host",
		"hits", "misses", "evictions", "invalidations", "load_errors", "resident_bytes", "capacity_bytes",
		"leases_active", "leases_total", "lease_denied", "cufile_mode", "cufile", "passthrough"} {
		if _, ok := after[k]; !ok {
			t.Errorf("stats.json lacks %s", k)
		}
	}
	text, err := exec.Command(bins.gdsfs, "stats", m.mnt).Output()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(text), "[fuse]\nopens 6\n") {
		t.Errorf("stats text does not say opens 6:\n%s", text)
	}
	if !strings.Contains(string(text), "\n[cufile]\nstatistics ") || strings.Contains(string(text), "\nattribution mismatch") ||
		strings.HasPrefix(after["cufile_mode"].(string), "unavailable: ") && !strings.Contains(string(text), "\nattribution unavailable: no cuFile: ") {
		t.Errorf("stats text: no [cufile] section, a mismatch, or no reason why there are no cuFile statistics:\n%s", text)
	}
	for _, name := range []string{"config", "version", "socket", "cache"} {
		if m.control(name) == "" {
			t.Errorf(".gdsfs/%s is empty", name)
		}
	}
	if !strings.Contains(m.control("config"), "prefetch: manual") {
		t.Error(".gdsfs/config does not show the effective configuration")
	}
}

// TestUnmount: gdsfs umount and SIGTERM unmount cleanly; a busy mount is
// reported with who holds it and stays served.
func TestUnmount(t *testing.T) {
	src := sourceTree(t)
	m := startMount(t, src)
	f, err := os.Open(m.path("hello.txt"))
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bins.gdsfs, "umount", m.mnt).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "busy, in use by pid") {
		t.Fatalf("umount of a busy mount: %v %q", err, out)
	}
	// A SIGTERM on a busy mount: TestStopWithOpenFile (ops_test.go).
	if b, err := os.ReadFile(m.path("hello.txt")); err != nil || string(b) != "hello, gdsfs\n" {
		t.Fatalf("busy mount stopped serving after a refused umount: %v", err)
	}
	f.Close()
	if out, err := exec.Command(bins.gdsfs, "umount", m.mnt).CombinedOutput(); err != nil {
		t.Fatalf("umount: %v %s", err, out)
	}
	select {
	case err := <-m.exited:
		if err != nil {
			t.Fatalf("daemon exit after umount: %v\n%s", err, m.log)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("daemon did not exit after umount")
	}
}

// TestNoStalePageCache: without passthrough the kernel keeps a file's pages
// across opens; a change made in SOURCE must still be seen at the next open.
func TestNoStalePageCache(t *testing.T) {
	src := t.TempDir()
	randomFile(t, filepath.Join(src, "f"), 1<<20, 1)
	m := startMount(t, src, "fuse.passthrough=off")
	for round := 2; round < 6; round++ {
		if sha(t, m.path("f")) != sha(t, filepath.Join(src, "f")) {
			t.Fatalf("round %d: the mount serves bytes SOURCE does not hold", round)
		}
		randomFile(t, filepath.Join(src, "f"), 1<<20, round) // same size, new bytes
	}
}

// TestGetfattrDump: `getfattr -d -m -` lists the user.gdsfs.* attributes
// of a regular file beside its own, and only those that have a value.
func TestGetfattrDump(t *testing.T) {
	need(t, "getfattr")
	src := sourceTree(t)
	m := startMount(t, src, "staging.prefetch=manual")
	dump := func(rel string) string {
		return sh(t, "getfattr --absolute-names -d -m - "+m.path(rel))
	}
	if got := dump("hello.txt"); !strings.Contains(got, `user.gdsfs.state="absent"`) ||
		!strings.Contains(got, `user.origin="source"`) || strings.Contains(got, "user.gdsfs.path") {
		t.Errorf("getfattr -d of an unstaged file:\n%s", got)
	}
	if err := os.WriteFile(m.path(".gdsfs/prefetch"), []byte("data/fe.bin\n"), 0); err != nil {
		t.Fatal(err)
	}
	waitState(t, m.path("data/fe.bin"), "resident")
	if got := dump("data/fe.bin"); !strings.Contains(got, `user.gdsfs.state="resident"`) ||
		!strings.Contains(got, `user.gdsfs.path="host"`) {
		t.Errorf("getfattr -d of a staged file:\n%s", got)
	}
	if got := sh(t, "getfattr --absolute-names -d -m - "+m.path("data")); strings.Contains(got, "gdsfs") {
		t.Errorf("a directory lists gdsfs attributes:\n%s", got)
	}
}

// TestGdsfsXattrOfAReplacedFile: user.gdsfs.* asked through a descriptor
// opened before SOURCE's file was replaced (renamed over) must not
// describe the new file: it is an error (ESTALE, or ENOENT once the kernel
// looked the path up again), while the descriptor still reads the old
// bytes and the path the new ones.
func TestGdsfsXattrOfAReplacedFile(t *testing.T) {
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "f"), []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	m := startMount(t, src, "staging.prefetch=manual")
	f, err := os.Open(m.path("f"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 64)
	if _, err := unix.Fgetxattr(int(f.Fd()), "user.gdsfs.state", buf); err != nil {
		t.Fatalf("user.gdsfs.state of the open file: %v", err)
	}
	if err := os.WriteFile(filepath.Join(src, "g"), []byte("new!"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(src, "g"), filepath.Join(src, "f")); err != nil {
		t.Fatal(err)
	}
	n, err := unix.Fgetxattr(int(f.Fd()), "user.gdsfs.state", buf)
	if !errors.Is(err, unix.ESTALE) && !errors.Is(err, unix.ENOENT) {
		t.Fatalf("user.gdsfs.state through the replaced file's descriptor: %q, %v; want ESTALE or ENOENT", buf[:max(n, 0)], err)
	}
	if got, err := io.ReadAll(f); err != nil || string(got) != "old" {
		t.Fatalf("the descriptor reads %q, %v; want the old bytes", got, err)
	}
}
