package integration

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// nobody is the unprivileged user the security tests act as.
const nobody = 65534

// userDir is a temporary directory uid 65534 can reach (the test's own
// temporary directories are 0700).
func userDir(t *testing.T) string {
	t.Helper()
	d := t.TempDir()
	for _, p := range []string{d, filepath.Dir(d)} {
		if err := os.Chmod(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return d
}

// as runs fsuser ARGS as uid 65534 (with the supplementary groups given),
// or as root when groups is nil and asRoot is set, and returns its output.
func fsuser(t *testing.T, cred *syscall.Credential, args ...string) string {
	t.Helper()
	cmd := exec.Command(bins.fsuser, args...)
	if cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("fsuser %v: %v\n%s%s", args, err, out.String(), errb.String())
	}
	return strings.TrimSpace(out.String())
}

func user(groups ...uint32) *syscall.Credential {
	return &syscall.Credential{Uid: nobody, Gid: nobody, Groups: groups}
}

// snapshot describes everything under dir that a change could touch:
// names, types, modes, owners, sizes, times, contents and user xattrs.
func snapshot(t *testing.T, dir string) string {
	t.Helper()
	return sh(t, "cd "+dir+" && find . -printf '%p %y %m %U %G %s %T@ %C@\\n' | sort && "+
		"find . -type f -print0 | sort -z | xargs -0 -r sha256sum && getfattr -R -d -m - --absolute-names . 2>/dev/null | sort")
}

// TestSymlinkSwapRace: a user who owns a directory in SOURCE and can write
// SOURCE directly swaps an entry for a symbolic link to a root-owned file
// or directory outside SOURCE between the kernel's lookup and the daemon's
// call, many times for each kind of change. Nothing outside SOURCE may
// change.
func TestSymlinkSwapRace(t *testing.T) {
	need(t, "getfattr")
	needMount(t)
	src := userDir(t)
	outside := t.TempDir() // root's, 0700
	secret := filepath.Join(outside, "secret")
	if err := os.WriteFile(secret, []byte("root's secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	rootDir := filepath.Join(outside, "rootdir")
	os.Mkdir(rootDir, 0o755)
	os.WriteFile(filepath.Join(rootDir, "x"), []byte("root's file in root's directory\n"), 0o600)
	u := filepath.Join(src, "u")
	os.Mkdir(u, 0o755)
	os.WriteFile(filepath.Join(u, "f"), []byte("the user's own file\n"), 0o644)
	os.WriteFile(filepath.Join(u, "g"), []byte("another of the user's files\n"), 0o644)
	os.Mkdir(filepath.Join(u, "d"), 0o755)
	os.WriteFile(filepath.Join(u, "d/x"), []byte("the user's file in the user's directory\n"), 0o644)
	os.Symlink(secret, filepath.Join(u, "alt"))
	os.Symlink(rootDir, filepath.Join(u, "dalt"))
	sh(t, "chown -hR 65534:65534 "+u)
	before := snapshot(t, outside)
	// No caching (and no change events, which would let the kernel
	// cache): every change is looked up anew, so the swap lands between
	// the lookup and the call as often as it can.
	m := startMount(t, src, "fuse.read_only=false", "fuse.allow_other=true",
		"fuse.entry_timeout=0s", "fuse.attr_timeout=0s", "staging.watch=timestamps")
	os.Chmod(filepath.Dir(m.mnt), 0o755)
	out := fsuser(t, user(), "race", src, m.mnt, "300")
	t.Logf("through the mount while swapping (kind, succeeded, failed):\n%s", out)
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[1] == "0" {
			t.Errorf("%s never succeeded: the race did not reach the daemon's path", f[0])
		}
	}
	if after := snapshot(t, outside); after != before {
		t.Fatalf("a change through the mount escaped SOURCE:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}

// TestACLsThroughMount: an ACL entry denying the user, a group the user
// is in masked to nothing, and a named-group entry whose read right the
// mask takes away refuse reads through an allow_other mount. The mode bits allow the first and the last: only acting as the
// caller on SOURCE refuses them. (With a mask of ---, the group class bits
// are 0 and the kernel decides from the mode bits alone, natively too.)
func TestACLsThroughMount(t *testing.T) {
	need(t, "setfacl", "getfacl")
	needMount(t)
	src := userDir(t)
	for _, f := range []struct{ name, group, acl string }{
		{"denied", "0", "u:65534:---"},
		{"masked", "4242", "m::---"},
		{"masked-named", "0", "g:4242:r--,m::-w-"},
		{"open", "0", ""},
	} {
		p := filepath.Join(src, f.name)
		os.WriteFile(p, []byte(f.name), 0o644)
		sh(t, "chmod 644 "+p+" && chgrp "+f.group+" "+p)
		if f.acl != "" {
			sh(t, "setfacl -m "+f.acl+" "+p)
		}
	}
	m := startMount(t, src, "fuse.allow_other=true", "fuse.read_only=false")
	os.Chmod(filepath.Dir(m.mnt), 0o755)
	member := user(4242)
	for _, tc := range []struct{ name, native, want string }{
		{"denied", filepath.Join(src, "denied"), "EACCES"},
		{"masked", filepath.Join(src, "masked"), "EACCES"},
		{"masked-named", filepath.Join(src, "masked-named"), "EACCES"},
		{"open", filepath.Join(src, "open"), `OK "open"`},
	} {
		if got := fsuser(t, member, "read", tc.native); got != tc.want {
			t.Fatalf("natively %s reads %q, want %q: the test's premise is wrong", tc.name, got, tc.want)
		}
		if got := fsuser(t, member, "read", m.path(tc.name)); got != tc.want {
			t.Errorf("through the mount %s reads %q, want %q", tc.name, got, tc.want)
		}
	}
	// ACLs set through the mount: by the owner, keeping the entries there
	// were; not by anyone else.
	own := filepath.Join(src, "own")
	os.WriteFile(own, nil, 0o644)
	sh(t, "chown 65534 "+own+" && setfacl -m u:65533:rw- "+own)
	setfacl := func(cred *syscall.Credential, args ...string) error {
		cmd := exec.Command("setfacl", args...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		return cmd.Run()
	}
	if err := setfacl(user(), "-m", "g:4242:r--", m.path("own")); err != nil {
		t.Fatalf("the owner's setfacl through the mount: %v", err)
	}
	if got := sh(t, "getfacl -cp "+own); !strings.Contains(got, "user:65533:rw-") || !strings.Contains(got, "group:4242:r--") {
		t.Errorf("ACL after the owner's setfacl through the mount:\n%s", got)
	}
	if err := setfacl(user(), "-m", "u:65534:rw-", m.path("open")); err == nil {
		t.Errorf("setfacl on root's file by uid 65534 through the mount succeeded")
	}
}

// TestUmaskAppliedOnce: the caller's umask is applied once, by the kernel.
func TestUmaskAppliedOnce(t *testing.T) {
	needMount(t)
	src := userDir(t)
	os.Chmod(src, 0o777)
	m := startMount(t, src, "fuse.read_only=false", "fuse.allow_other=true")
	os.Chmod(filepath.Dir(m.mnt), 0o755)
	for i, tc := range []struct {
		umask, op, mode, want string
	}{
		{"0", "create", "666", "666"},
		{"0", "create", "620", "620"},
		{"022", "create", "666", "644"},
		{"027", "create", "666", "640"},
		{"0", "mkdir", "777", "777"},
		{"022", "mkdir", "777", "755"},
		{"0", "mkfifo", "666", "666"},
	} {
		for _, cred := range []*syscall.Credential{nil, user()} {
			name := tc.op + "-" + tc.umask + "-" + tc.mode + "-" + string(rune('a'+i))
			if cred != nil {
				name += "-user"
			}
			if got := fsuser(t, cred, "-umask", tc.umask, tc.op, m.path(name), tc.mode); got != "OK" {
				t.Fatalf("%s: %s", name, got)
			}
			got := strings.TrimSpace(sh(t, "stat -c %a "+filepath.Join(src, name)))
			if got != tc.want {
				t.Errorf("umask %s, %s %s: mode %s, want %s", tc.umask, tc.op, tc.mode, got, tc.want)
			}
		}
	}
}

// TestCacheListingFiltered: .gdsfs/cache shows a reader only the staged
// files they may open for reading.
func TestCacheListingFiltered(t *testing.T) {
	needMount(t)
	src := userDir(t)
	randomFile(t, filepath.Join(src, "pub/open.bin"), 5000, 1)
	randomFile(t, filepath.Join(src, "private/hidden.bin"), 6000, 2)
	os.Chmod(filepath.Join(src, "pub"), 0o755)
	os.Chmod(filepath.Join(src, "private"), 0o700)
	m := startMount(t, src, "fuse.allow_other=true", "staging.prefetch=manual")
	os.Chmod(filepath.Dir(m.mnt), 0o755)
	if err := os.WriteFile(m.path(".gdsfs/prefetch"), []byte("pub/open.bin\nprivate/hidden.bin\n"), 0); err != nil {
		t.Fatal(err)
	}
	waitState(t, m.path("pub/open.bin"), "resident")
	waitState(t, m.path("private/hidden.bin"), "resident")
	if got := m.control("cache"); !strings.Contains(got, "pub/open.bin") || !strings.Contains(got, "private/hidden.bin") {
		t.Fatalf("root's listing lacks an entry:\n%s", got)
	}
	got := fsuser(t, user(), "read", m.path(".gdsfs/cache"))
	if !strings.Contains(got, "pub/open.bin") || strings.Contains(got, "hidden") {
		t.Errorf("uid 65534's listing: %s; want pub/open.bin only", got)
	}
}

// TestControlWritesNeverBlock: writing the path of a FIFO or a device node
// to .gdsfs/prefetch fails at once, and the daemon still unmounts and
// exits on SIGTERM.
func TestControlWritesNeverBlock(t *testing.T) {
	needMount(t)
	src := t.TempDir()
	if err := syscall.Mkfifo(filepath.Join(src, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mknod(filepath.Join(src, "null"), syscall.S_IFCHR|0o644, 1<<8|3); err != nil {
		t.Fatal(err)
	}
	m := startMount(t, src)
	for _, name := range []string{"fifo", "null"} {
		done := make(chan error, 1)
		go func() { // a blocked write cannot be killed: wait for it here
			f, err := os.OpenFile(m.path(".gdsfs/prefetch"), os.O_WRONLY, 0)
			if err == nil {
				_, err = f.Write([]byte(name + "\n"))
				f.Close()
			}
			done <- err
		}()
		select {
		case err := <-done:
			if err == nil {
				t.Errorf("prefetch of %s succeeded, want an error", name)
			}
			t.Logf("prefetch %s: %v", name, err)
		case <-time.After(10 * time.Second):
			t.Fatalf("prefetch of %s blocked for 10s", name)
		}
	}
	m.stop() // fails the test if the daemon does not exit on SIGTERM
}
