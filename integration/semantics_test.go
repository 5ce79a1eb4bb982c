package integration

import (
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// longPath is a relative path of n bytes made of components of 127 bytes
// (pjdfstest's dirgen_max: NAME_MAX/2), the last one a file name.
func longPath(n int) string {
	var b strings.Builder
	for i := 0; b.Len() < n; i++ {
		if b.Len() > 0 {
			b.WriteByte('/')
		}
		b.WriteString(fmt.Sprintf("%03d", i) + strings.Repeat("d", 124))
	}
	return b.String()[:n]
}

// pathMaxCalls makes, beneath the directory base, the calls pjdfstest's
// chmod/03, chown/03, truncate/03 and ftruncate/03 make on a path of
// PATH_MAX-1 bytes (relative to the caller's directory, so the path from
// the mount's root is longer still), and the one-byte-longer path that
// must fail ENAMETOOLONG. It returns what went wrong, one line a call.
func pathMaxCalls(t *testing.T, base string) []string {
	t.Helper()
	dirfd, err := unix.Open(base, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(dirfd)
	p := longPath(unix.PathMax - 1)
	dir, name := p[:strings.LastIndexByte(p, '/')], p[strings.LastIndexByte(p, '/')+1:]
	for i, c := range dir {
		if c == '/' {
			if err := unix.Mkdirat(dirfd, dir[:i], 0o755); err != nil {
				t.Fatalf("mkdir %d bytes deep: %v", i, err)
			}
		}
	}
	if err := unix.Mkdirat(dirfd, dir, 0o755); err != nil {
		t.Fatalf("mkdir %d bytes deep: %v", len(dir), err)
	}
	var bad []string
	check := func(what string, err, want error) {
		if err != want {
			bad = append(bad, fmt.Sprintf("%s: %v, want %v", what, err, want))
		}
	}
	stat := func(what string, ok func(*unix.Stat_t) bool) {
		var st unix.Stat_t
		err := unix.Fstatat(dirfd, p, &st, unix.AT_SYMLINK_NOFOLLOW)
		if err == nil && !ok(&st) {
			err = fmt.Errorf("mode %o owner %d:%d size %d", st.Mode, st.Uid, st.Gid, st.Size)
		}
		check("stat after "+what, err, nil)
	}
	fd, err := unix.Openat(dirfd, p, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
	check("create", err, nil)
	if err == nil {
		unix.Close(fd)
	}
	check("chmod", unix.Fchmodat(dirfd, p, 0o642, 0), nil)
	stat("chmod", func(st *unix.Stat_t) bool { return st.Mode&0o7777 == 0o642 })
	check("chown", unix.Fchownat(dirfd, p, 65534, 65534, 0), nil)
	stat("chown", func(st *unix.Stat_t) bool { return st.Uid == 65534 && st.Gid == 65534 })
	// truncate(2) by path: the parent reached through /proc keeps the
	// argument short; the kernel sends a size change without a handle.
	parent, err := unix.Openat(dirfd, dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	check("truncate", unix.Truncate(fmt.Sprintf("/proc/self/fd/%d/%s", parent, name), 77), nil)
	unix.Close(parent)
	stat("truncate", func(st *unix.Stat_t) bool { return st.Size == 77 })
	fd, err = unix.Openat(dirfd, p, unix.O_RDWR|unix.O_CLOEXEC, 0)
	check("open for ftruncate", err, nil)
	if err == nil {
		check("ftruncate", unix.Ftruncate(fd, 123), nil)
		unix.Close(fd)
	}
	stat("ftruncate", func(st *unix.Stat_t) bool { return st.Size == 123 })
	check("chmod one byte over PATH_MAX", unix.Fchmodat(dirfd, p+"x", 0o642, 0), unix.ENAMETOOLONG)
	check("unlink", unix.Unlinkat(dirfd, p, 0), nil)
	return bad
}

// TestPathMaxThroughMount: chmod, chown, truncate and ftruncate of a file
// at PATH_MAX-1 bytes from the caller's directory (a directory of the
// mount, so beneath SOURCE the path is longer than PATH_MAX) succeed as on
// the native filesystem, on a read-write allow_other mount.
func TestPathMaxThroughMount(t *testing.T) {
	native := t.TempDir()
	if bad := pathMaxCalls(t, native); len(bad) > 0 {
		t.Fatalf("on the native filesystem (the test's own expectations):\n%s", strings.Join(bad, "\n"))
	}
	src := t.TempDir()
	if err := os.Mkdir(filepath.Join(src, "cwd"), 0o755); err != nil {
		t.Fatal(err)
	}
	m := startMount(t, src, "fuse.read_only=false", "fuse.allow_other=true", "fuse.passthrough=off")
	if bad := pathMaxCalls(t, m.path("cwd")); len(bad) > 0 {
		t.Fatalf("through the mount:\n%s", strings.Join(bad, "\n"))
	}
}

// readBoth reads rel through the mount and leases it, and returns each
// answer: the SHA-256 of the bytes, or the error's errno name.
func readBoth(t *testing.T, m *mount, rel string) (mounted, leased string) {
	t.Helper()
	if b, err := os.ReadFile(m.path(rel)); err != nil {
		mounted = errnoName(err)
	} else {
		mounted = fmt.Sprintf("%x", sha256.Sum256(b))
	}
	out, err := exec.Command(bins.leasecheck, m.path(rel)).Output()
	var r struct{ SHA256 string }
	switch {
	case err != nil:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 3 {
			t.Fatalf("leasecheck %s: %v %s", rel, err, out)
		}
		leased, _, _ = strings.Cut(string(ee.Stderr), " ")
	case json.Unmarshal(out, &r) != nil:
		t.Fatalf("leasecheck %s: %q", rel, out)
	default:
		leased = r.SHA256
	}
	return mounted, leased
}

func errnoName(err error) string {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return unix.ErrnoName(errno)
	}
	return err.Error()
}

// TestSourceReplaced: the mount serves the directory it mounted, as a
// bind mount does, and so do leases. SOURCE removed and made again: both
// answer ENOENT for the old names and the new ones. SOURCE renamed away
// and made again: both serve the renamed directory.
func TestSourceReplaced(t *testing.T) {
	for _, how := range []string{"removed", "renamed"} {
		t.Run(how, func(t *testing.T) {
			parent := t.TempDir()
			src := filepath.Join(parent, "src")
			randomFile(t, filepath.Join(src, "f"), 70000, 1)
			randomFile(t, filepath.Join(src, "g"), 70000, 2)
			m := startMount(t, src)
			old := sha(t, filepath.Join(src, "f"))
			if mounted, leased := readBoth(t, m, "f"); mounted != old || leased != old {
				t.Fatalf("before: mount %s, lease %s, want %s", mounted, leased, old)
			}
			if how == "removed" {
				if err := os.RemoveAll(src); err != nil {
					t.Fatal(err)
				}
			} else if err := os.Rename(src, src+".old"); err != nil {
				t.Fatal(err)
			}
			for i, rel := range []string{"f", "g", "h"} {
				randomFile(t, filepath.Join(src, rel), 50000, 10+i)
			}
			for _, rel := range []string{"f", "g", "h"} {
				want := "ENOENT"
				if how == "renamed" && rel != "h" {
					want = sha(t, filepath.Join(src+".old", rel))
				}
				if mounted, leased := readBoth(t, m, rel); mounted != want || leased != want {
					t.Errorf("%s after SOURCE was %s and made again: mount %s, lease %s, want %s", rel, how, mounted, leased, want)
				}
			}
			if how == "removed" {
				m.log.waitFor("SOURCE was removed") // logged as the change is seen; checked below
			}
			if gone := strings.Contains(m.log.String(), "SOURCE was removed"); gone != (how == "removed") {
				t.Errorf("the daemon's log says SOURCE was removed: %v\n%s", gone, m.log)
			}
		})
	}
}
