package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The POSIX conformance table: each case sets up entries as root, makes
// one call as root or as uid 65534 (groups 65534 and 4242) through
// fsuser, and checks the answer and what the call left. Every case runs
// on a native directory and through a read-write allow_other mount of
// another one on the same filesystem. pjdfstest, the suite this stands in
// for, is not obtainable here (docs/conformance.md says why).

// entry is one thing a case sets up, as root, in its directory.
type entry struct {
	path     string
	mode     uint32 // with the type bits: S_IFDIR, S_IFREG (default)
	uid, gid int
	acl      string // for setfacl -m
}

const other = 65533 // another unprivileged user

func reg(p string, mode uint32, uid, gid int) entry {
	return entry{p, syscall.S_IFREG | mode, uid, gid, ""}
}
func dir(p string, mode uint32, uid, gid int) entry {
	return entry{p, syscall.S_IFDIR | mode, uid, gid, ""}
}

type conformanceCase struct {
	name  string
	setup []entry
	root  bool     // act as root rather than uid 65534
	umask string   // "022" when empty
	call  []string // fsuser op and arguments; paths are relative to the case directory
	want  string   // fsuser's answer
	probe string   // "PATH what" checked after the call (see probe); "" checks nothing
	after string   // the probe's expected value
}

var conformanceCases = []conformanceCase{
	// Modes of new files: the caller's umask, applied once.
	{name: "create 0666 umask 0", setup: []entry{dir("w", 0o777, 0, 0)}, umask: "0", call: []string{"create", "w/f", "666"}, want: "OK", probe: "w/f mode", after: "666"},
	{name: "create 0620 umask 0", setup: []entry{dir("w", 0o777, 0, 0)}, umask: "0", call: []string{"create", "w/f", "620"}, want: "OK", probe: "w/f mode", after: "620"},
	{name: "create 0666 umask 022", setup: []entry{dir("w", 0o777, 0, 0)}, call: []string{"create", "w/f", "666"}, want: "OK", probe: "w/f mode", after: "644"},
	{name: "create owner and group", setup: []entry{dir("w", 0o777, 0, 0)}, call: []string{"create", "w/f", "600"}, want: "OK", probe: "w/f owner", after: "65534:65534"},
	{name: "mkdir 0777 umask 022", setup: []entry{dir("w", 0o777, 0, 0)}, call: []string{"mkdir", "w/d", "777"}, want: "OK", probe: "w/d mode", after: "755"},
	{name: "mkdir 01777 umask 0", setup: []entry{dir("w", 0o777, 0, 0)}, umask: "0", call: []string{"mkdir", "w/d", "1777"}, want: "OK", probe: "w/d mode", after: "1777"},
	{name: "mkfifo 0666 umask 027", setup: []entry{dir("w", 0o777, 0, 0)}, umask: "027", call: []string{"mkfifo", "w/p", "666"}, want: "OK", probe: "w/p mode", after: "640"},
	{name: "create in a setgid directory takes its group", setup: []entry{dir("g", 0o2777, 0, 4242)}, call: []string{"create", "g/f", "644"}, want: "OK", probe: "g/f owner", after: "65534:4242"},
	{name: "mkdir in a setgid directory inherits setgid", setup: []entry{dir("g", 0o2777, 0, 4242)}, call: []string{"mkdir", "g/d", "755"}, want: "OK", probe: "g/d mode", after: "2755"},
	{name: "create under a default ACL ignores the umask", setup: []entry{{"a", syscall.S_IFDIR | 0o777, 0, 0, "d:u::rwx,d:g::rwx,d:o::rwx"}}, call: []string{"create", "a/f", "666"}, want: "OK", probe: "a/f mode", after: "666"},
	{name: "mkdir under a default ACL inherits it", setup: []entry{{"a", syscall.S_IFDIR | 0o777, 0, 0, "d:u::rwx,d:g::r-x,d:o::---"}}, umask: "0", call: []string{"mkdir", "a/d", "777"}, want: "OK", probe: "a/d mode", after: "750"},
	{name: "create in a directory not writable", setup: []entry{dir("r", 0o755, 0, 0)}, call: []string{"create", "r/f", "644"}, want: "EACCES", probe: "r/f exists", after: "no"},
	{name: "create an existing name exclusively", setup: []entry{dir("w", 0o777, 0, 0), reg("w/f", 0o644, 0, 0)}, call: []string{"create", "w/f", "644"}, want: "EEXIST"},
	{name: "mkdir an existing name", setup: []entry{dir("w", 0o777, 0, 0), reg("w/f", 0o644, 0, 0)}, call: []string{"mkdir", "w/f", "755"}, want: "EEXIST"},

	// chmod: the owner (or root) only; setgid dropped for a group one is not in.
	{name: "chmod own file", setup: []entry{reg("f", 0o644, nobody, nobody)}, call: []string{"chmod", "f", "600"}, want: "OK", probe: "f mode", after: "600"},
	{name: "chmod another's file", setup: []entry{reg("f", 0o666, other, other)}, call: []string{"chmod", "f", "777"}, want: "EPERM", probe: "f mode", after: "666"},
	{name: "chmod another's file as root", setup: []entry{reg("f", 0o666, other, other)}, root: true, call: []string{"chmod", "f", "4700"}, want: "OK", probe: "f mode", after: "4700"},
	{name: "chmod setgid, group not mine", setup: []entry{reg("f", 0o644, nobody, other)}, call: []string{"chmod", "f", "2755"}, want: "OK", probe: "f mode", after: "755"},
	{name: "chmod setgid, group mine", setup: []entry{reg("f", 0o644, nobody, 4242)}, call: []string{"chmod", "f", "2755"}, want: "OK", probe: "f mode", after: "2755"},
	{name: "chmod setuid own file", setup: []entry{reg("f", 0o644, nobody, nobody)}, call: []string{"chmod", "f", "4755"}, want: "OK", probe: "f mode", after: "4755"},
	{name: "chmod sticky on own directory", setup: []entry{dir("d", 0o755, nobody, nobody)}, call: []string{"chmod", "d", "1777"}, want: "OK", probe: "d mode", after: "1777"},

	// chown: root gives files away; an owner only changes the group, to
	// one of its own; a change of owner or group clears set-id bits.
	{name: "chown own file to another user", setup: []entry{reg("f", 0o644, nobody, nobody)}, call: []string{"chown", "f", "65533", "-1"}, want: "EPERM", probe: "f owner", after: "65534:65534"},
	{name: "chgrp own file to a group of mine", setup: []entry{reg("f", 0o644, nobody, nobody)}, call: []string{"chown", "f", "-1", "4242"}, want: "OK", probe: "f owner", after: "65534:4242"},
	{name: "chgrp own file to a group not mine", setup: []entry{reg("f", 0o644, nobody, nobody)}, call: []string{"chown", "f", "-1", "65533"}, want: "EPERM", probe: "f owner", after: "65534:65534"},
	{name: "chgrp another's file", setup: []entry{reg("f", 0o666, other, 4242)}, call: []string{"chown", "f", "-1", "4242"}, want: "EPERM"},
	{name: "chown as root", setup: []entry{reg("f", 0o644, nobody, nobody)}, root: true, call: []string{"chown", "f", "65533", "4242"}, want: "OK", probe: "f owner", after: "65533:4242"},
	{name: "chgrp clears setuid", setup: []entry{reg("f", 0o4755, nobody, nobody)}, call: []string{"chown", "f", "-1", "4242"}, want: "OK", probe: "f mode", after: "755"},
	{name: "chown by root clears setuid", setup: []entry{reg("f", 0o4755, nobody, nobody)}, root: true, call: []string{"chown", "f", "65533", "-1"}, want: "OK", probe: "f mode", after: "755"},
	{name: "lchown of a symlink leaves its target", setup: []entry{reg("f", 0o644, 0, 0), {"l", syscall.S_IFLNK, 0, 0, "f"}}, root: true, call: []string{"lchown", "l", "65533", "65533"}, want: "OK", probe: "f owner", after: "0:0"},

	// truncate: write permission; a directory is not truncated.
	{name: "truncate another's 0644 file", setup: []entry{reg("f", 0o644, other, other)}, call: []string{"truncate", "f", "0"}, want: "EACCES", probe: "f size", after: "5"},
	{name: "truncate another's 0666 file", setup: []entry{reg("f", 0o666, other, other)}, call: []string{"truncate", "f", "2"}, want: "OK", probe: "f size", after: "2"},
	{name: "truncate own 0444 file", setup: []entry{reg("f", 0o444, nobody, nobody)}, call: []string{"truncate", "f", "0"}, want: "EACCES", probe: "f size", after: "5"},
	{name: "truncate 0444 file as root", setup: []entry{reg("f", 0o444, other, other)}, root: true, call: []string{"truncate", "f", "9"}, want: "OK", probe: "f size", after: "9"},
	{name: "truncate a directory", setup: []entry{dir("d", 0o777, nobody, nobody)}, call: []string{"truncate", "d", "0"}, want: "EISDIR"},
	{name: "ftruncate another's 0666 file", setup: []entry{reg("f", 0o666, other, other)}, call: []string{"ftruncate", "f", "1"}, want: "OK", probe: "f size", after: "1"},
	{name: "truncate by a non-owner clears setuid", setup: []entry{reg("f", 0o4777, other, other)}, call: []string{"truncate", "f", "1"}, want: "OK", probe: "f mode", after: "777"},
	{name: "write by a non-owner clears setuid", setup: []entry{reg("f", 0o4777, other, other)}, call: []string{"write", "f", "x"}, want: "OK", probe: "f mode", after: "777"},

	// utimes: "now" needs write access, explicit times ownership.
	{name: "touch another's 0666 file", setup: []entry{reg("f", 0o666, other, other)}, call: []string{"touch", "f"}, want: "OK"},
	{name: "touch another's 0644 file", setup: []entry{reg("f", 0o644, other, other)}, call: []string{"touch", "f"}, want: "EACCES"},
	{name: "utimes another's 0666 file", setup: []entry{reg("f", 0o666, other, other)}, call: []string{"utimes", "f", "1000000000"}, want: "EPERM", probe: "f mtime", after: "1500000000"},
	{name: "utimes own file", setup: []entry{reg("f", 0o444, nobody, nobody)}, call: []string{"utimes", "f", "1000000000"}, want: "OK", probe: "f mtime", after: "1000000000"},
	{name: "utimes as root", setup: []entry{reg("f", 0o444, other, other)}, root: true, call: []string{"utimes", "f", "1000000000"}, want: "OK", probe: "f mtime", after: "1000000000"},

	// Sticky directories: only the file's or the directory's owner (or
	// root) removes or renames an entry.
	{name: "sticky: unlink another's file", setup: []entry{dir("s", 0o1777, 0, 0), reg("s/f", 0o666, other, other)}, call: []string{"unlink", "s/f"}, want: "EPERM", probe: "s/f exists", after: "yes"},
	{name: "sticky: unlink own file", setup: []entry{dir("s", 0o1777, 0, 0), reg("s/f", 0o644, nobody, nobody)}, call: []string{"unlink", "s/f"}, want: "OK", probe: "s/f exists", after: "no"},
	{name: "sticky: rename another's file", setup: []entry{dir("s", 0o1777, 0, 0), reg("s/f", 0o666, other, other)}, call: []string{"rename", "s/f", "s/g"}, want: "EPERM", probe: "s/f exists", after: "yes"},
	{name: "sticky: rename over another's file", setup: []entry{dir("s", 0o1777, 0, 0), reg("s/f", 0o644, nobody, nobody), reg("s/g", 0o666, other, other)}, call: []string{"rename", "s/f", "s/g"}, want: "EPERM", probe: "s/g owner", after: "65533:65533"},
	{name: "sticky: directory owner unlinks another's file", setup: []entry{dir("s", 0o1777, nobody, nobody), reg("s/f", 0o644, other, other)}, call: []string{"unlink", "s/f"}, want: "OK", probe: "s/f exists", after: "no"},
	{name: "sticky: root unlinks another's file", setup: []entry{dir("s", 0o1777, 0, 0), reg("s/f", 0o644, other, other)}, root: true, call: []string{"unlink", "s/f"}, want: "OK", probe: "s/f exists", after: "no"},
	{name: "sticky: rmdir another's directory", setup: []entry{dir("s", 0o1777, 0, 0), dir("s/d", 0o777, other, other)}, call: []string{"rmdir", "s/d"}, want: "EPERM", probe: "s/d exists", after: "yes"},

	// rename, link, unlink.
	{name: "unlink in a directory not writable", setup: []entry{dir("r", 0o755, 0, 0), reg("r/f", 0o666, nobody, nobody)}, call: []string{"unlink", "r/f"}, want: "EACCES", probe: "r/f exists", after: "yes"},
	{name: "unlink a missing name", setup: []entry{dir("w", 0o777, 0, 0)}, call: []string{"unlink", "w/nothing"}, want: "ENOENT"},
	{name: "unlink a directory", setup: []entry{dir("w", 0o777, nobody, nobody), dir("w/d", 0o777, nobody, nobody)}, call: []string{"unlink", "w/d"}, want: "EISDIR"},
	{name: "rmdir a non-empty directory", setup: []entry{dir("w", 0o777, nobody, nobody), dir("w/d", 0o777, nobody, nobody), reg("w/d/f", 0o644, nobody, nobody)}, call: []string{"rmdir", "w/d"}, want: "ENOTEMPTY"},
	{name: "rename a directory into itself", setup: []entry{dir("w", 0o777, nobody, nobody), dir("w/d", 0o777, nobody, nobody)}, call: []string{"rename", "w/d", "w/d/sub"}, want: "EINVAL"},
	{name: "rename a file over a directory", setup: []entry{dir("w", 0o777, nobody, nobody), reg("w/f", 0o644, nobody, nobody), dir("w/d", 0o777, nobody, nobody)}, call: []string{"rename", "w/f", "w/d"}, want: "EISDIR"},
	{name: "rename a directory over a file", setup: []entry{dir("w", 0o777, nobody, nobody), reg("w/f", 0o644, nobody, nobody), dir("w/d", 0o777, nobody, nobody)}, call: []string{"rename", "w/d", "w/f"}, want: "ENOTDIR"},
	{name: "rename over a non-empty directory", setup: []entry{dir("w", 0o777, nobody, nobody), dir("w/a", 0o777, nobody, nobody), dir("w/b", 0o777, nobody, nobody), reg("w/b/f", 0o644, nobody, nobody)}, call: []string{"rename", "w/a", "w/b"}, want: "ENOTEMPTY"},
	{name: "rename into a directory not writable", setup: []entry{dir("w", 0o777, nobody, nobody), reg("w/f", 0o644, nobody, nobody), dir("r", 0o755, 0, 0)}, call: []string{"rename", "w/f", "r/f"}, want: "EACCES"},
	{name: "rename over a file", setup: []entry{dir("w", 0o777, nobody, nobody), reg("w/f", 0o600, nobody, nobody), reg("w/g", 0o644, other, other)}, call: []string{"rename", "w/f", "w/g"}, want: "OK", probe: "w/g owner", after: "65534:65534"},
	{name: "link a directory", setup: []entry{dir("w", 0o777, nobody, nobody), dir("w/d", 0o777, nobody, nobody)}, call: []string{"link", "w/d", "w/e"}, want: "EPERM"},
	{name: "link another's 0600 file (protected_hardlinks)", setup: []entry{dir("w", 0o777, 0, 0), reg("w/f", 0o600, other, other)}, call: []string{"link", "w/f", "w/g"}, want: "EPERM"},
	{name: "link own file", setup: []entry{dir("w", 0o777, 0, 0), reg("w/f", 0o600, nobody, nobody)}, call: []string{"link", "w/f", "w/g"}, want: "OK", probe: "w/f nlink", after: "2"},
	{name: "link a symlink itself", setup: []entry{dir("w", 0o777, 0, 0), {"w/l", syscall.S_IFLNK, nobody, nobody, "/nonexistent"}}, call: []string{"link", "w/l", "w/m"}, want: "OK", probe: "w/m type", after: "symlink"},
	{name: "symlink over an existing name", setup: []entry{dir("w", 0o777, 0, 0), reg("w/f", 0o644, 0, 0)}, call: []string{"symlink", "x", "w/f"}, want: "EEXIST"},

	// Reading: mode bits, search rights and ACLs.
	{name: "read another's 0600 file", setup: []entry{reg("f", 0o600, other, other)}, call: []string{"read", "f"}, want: "EACCES"},
	{name: "read through a directory not searchable", setup: []entry{dir("p", 0o700, other, other), reg("p/f", 0o644, other, other)}, call: []string{"read", "p/f"}, want: "EACCES"},
	{name: "read with an ACL entry denying me", setup: []entry{{"f", syscall.S_IFREG | 0o644, other, other, "u:65534:---"}}, call: []string{"read", "f"}, want: "EACCES"},
	{name: "read with my named group masked", setup: []entry{{"f", syscall.S_IFREG | 0o644, other, other, "g:4242:r--,m::-w-"}}, call: []string{"read", "f"}, want: "EACCES"},
	{name: "read with an ACL entry granting me", setup: []entry{{"f", syscall.S_IFREG | 0o600, other, other, "u:65534:r--"}}, call: []string{"read", "f"}, want: `OK "abcde"`},
	{name: "access W_OK on own 0444 file", setup: []entry{reg("f", 0o444, nobody, nobody)}, call: []string{"access", "f", "2"}, want: "EACCES"},
	{name: "access R_OK on own 0444 file", setup: []entry{reg("f", 0o444, nobody, nobody)}, call: []string{"access", "f", "4"}, want: "OK"},
	{name: "access with an ACL entry denying me", setup: []entry{{"f", syscall.S_IFREG | 0o644, other, other, "u:65534:---"}}, call: []string{"access", "f", "4"}, want: "EACCES"},

	// Extended attributes.
	{name: "setxattr user.* on own file", setup: []entry{reg("f", 0o644, nobody, nobody)}, call: []string{"setxattr", "f", "user.x", "v"}, want: "OK"},
	{name: "setxattr user.* on another's 0644 file", setup: []entry{reg("f", 0o644, other, other)}, call: []string{"setxattr", "f", "user.x", "v"}, want: "EACCES"},
	{name: "setxattr trusted.* as a user", setup: []entry{reg("f", 0o644, nobody, nobody)}, call: []string{"setxattr", "f", "trusted.x", "v"}, want: "EPERM"},
	{name: "setxattr trusted.* as root", setup: []entry{reg("f", 0o644, nobody, nobody)}, root: true, call: []string{"setxattr", "f", "trusted.x", "v"}, want: "OK"},
	{name: "setxattr user.* on a symlink", setup: []entry{{"l", syscall.S_IFLNK, nobody, nobody, "/nonexistent"}}, root: true, call: []string{"setxattr", "l", "user.x", "v"}, want: "ENOENT"},
}

// knownDifferences are the cases that fail through the mount while they
// pass natively, each with why (docs/conformance.md lists them too). The
// test fails if one of them starts passing, so the list stays true.
var knownDifferences = map[string]string{}

// setUp creates the case's entries (as root) under dir.
func setUp(t *testing.T, dir string, es []entry) {
	t.Helper()
	for _, e := range es {
		p := filepath.Join(dir, e.path)
		var err error
		switch e.mode & syscall.S_IFMT {
		case syscall.S_IFDIR:
			err = os.Mkdir(p, 0)
		case syscall.S_IFLNK:
			err = os.Symlink(e.acl, p) // acl holds the target
			if err == nil {
				err = os.Lchown(p, e.uid, e.gid)
			}
			if err != nil {
				t.Fatal(err)
			}
			continue
		default:
			err = os.WriteFile(p, []byte("abcde"), 0)
		}
		if err == nil {
			err = os.Lchown(p, e.uid, e.gid)
		}
		if err == nil {
			err = syscall.Chmod(p, e.mode&0o7777) // after chown, which clears set-id bits
		}
		if err == nil && e.mode&syscall.S_IFMT == syscall.S_IFREG {
			err = os.Chtimes(p, time.Unix(1500000000, 0), time.Unix(1500000000, 0))
		}
		if err == nil && e.acl != "" {
			if out, e2 := exec.Command("setfacl", "-m", e.acl, p).CombinedOutput(); e2 != nil {
				err = fmt.Errorf("setfacl: %v %s", e2, out)
			}
		}
		if err != nil {
			t.Fatalf("set up %s: %v", e.path, err)
		}
	}
}

// probe reads back one property of PATH (relative to dir), as root.
func probe(dir, spec string) string {
	p, what, _ := strings.Cut(spec, " ")
	var st syscall.Stat_t
	if err := syscall.Lstat(filepath.Join(dir, p), &st); err != nil {
		if what == "exists" && err == syscall.ENOENT {
			return "no"
		}
		return err.Error()
	}
	switch what {
	case "exists":
		return "yes"
	case "mode":
		return fmt.Sprintf("%o", st.Mode&0o7777)
	case "owner":
		return fmt.Sprintf("%d:%d", st.Uid, st.Gid)
	case "size":
		return fmt.Sprint(st.Size)
	case "mtime":
		return fmt.Sprint(st.Mtim.Sec)
	case "nlink":
		return fmt.Sprint(st.Nlink)
	case "type":
		if st.Mode&syscall.S_IFMT == syscall.S_IFLNK {
			return "symlink"
		}
		return fmt.Sprintf("%o", st.Mode&syscall.S_IFMT)
	}
	return "unknown probe " + what
}

// TestConformance runs the table natively and through the mount (the
// daemon serving reads and writes, and kernel passthrough), as root and as
// uid 65534, and fails on any case that fails through the mount while it
// passes natively.
func TestConformance(t *testing.T) {
	need(t, "setfacl")
	needMount(t)
	for _, pt := range []string{"off", "auto"} {
		t.Run("passthrough="+pt, func(t *testing.T) { conformance(t, pt) })
	}
}

func conformance(t *testing.T, passthrough string) {
	native, src := userDir(t), userDir(t)
	m := startMount(t, src, "fuse.read_only=false", "fuse.allow_other=true", "fuse.passthrough="+passthrough)
	os.Chmod(filepath.Dir(m.mnt), 0o755)
	run := func(base, backing string, i int, c conformanceCase) (string, bool) {
		caseDir := fmt.Sprintf("c%02d", i)
		os.Mkdir(filepath.Join(backing, caseDir), 0o755)
		setUp(t, filepath.Join(backing, caseDir), c.setup)
		args := []string{"-umask", c.umask, c.call[0]}
		if c.umask == "" {
			args[1] = "022"
		}
		for j, a := range c.call[1:] {
			if isPathArg(c.call[0], j) {
				a = filepath.Join(base, caseDir, a)
			}
			args = append(args, a)
		}
		var cred *syscall.Credential
		if !c.root {
			cred = user(4242)
		}
		got := fsuser(t, cred, args...)
		result := got
		ok := got == c.want
		if c.probe != "" {
			after := probe(filepath.Join(backing, caseDir), c.probe)
			result += ", then " + c.probe + " = " + after
			ok = ok && after == c.after
		}
		return result, ok
	}
	differ := 0
	for i, c := range conformanceCases {
		nat, natOK := run(native, native, i, c)
		mnt, mntOK := run(m.mnt, src, i, c)
		want := c.want
		if c.probe != "" {
			want += ", then " + c.probe + " = " + c.after
		}
		why, known := knownDifferences[c.name]
		switch {
		case !natOK:
			t.Errorf("%s: natively %s, want %s (the table is wrong)", c.name, nat, want)
		case !mntOK && known:
			t.Logf("known difference: %s: through the mount %s, natively %s: %s", c.name, mnt, nat, why)
		case !mntOK:
			differ++
			t.Errorf("%s: through the mount %s, natively %s", c.name, mnt, nat)
		case known:
			t.Errorf("%s passes through the mount now: remove it from knownDifferences and docs/conformance.md", c.name)
		}
	}
	t.Logf("%d cases, %d known differences, %d new failures through the mount", len(conformanceCases), len(knownDifferences), differ)
}

// isPathArg reports whether argument j of op is a path in the case's
// directory.
func isPathArg(op string, j int) bool {
	switch op {
	case "rename", "link":
		return j <= 1
	case "symlink":
		return j == 1 // the target stays as written
	}
	return j == 0
}
