package fs

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/internal/units"

	"github.com/gdsfs/gdsfs/staging/watch"
)

func inoOf(t *testing.T, p string) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// reusedDir removes directory old in SOURCE while the kernel holds its
// node (an O_PATH descriptor through the mount, as a process whose
// working directory it is would), then makes directory new until SOURCE's
// filesystem gives it old's inode number, and looks new up through the
// mount.
func reusedDir(t *testing.T, src, mnt string, settle func()) (ino uint64) {
	t.Helper()
	s, m := func(p string) string { return filepath.Join(src, p) }, func(p string) string { return filepath.Join(mnt, p) }
	os.Mkdir(s("top"), 0o755)
	os.Mkdir(s("top/old"), 0o755)
	settle()
	fd, err := unix.Open(m("top/old"), unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	ino = inoOf(t, s("top/old"))
	os.Remove(s("top/old"))
	for i := 0; ; i++ {
		os.Remove(s("top/new"))
		os.Mkdir(s("top/new"), 0o755)
		if inoOf(t, s("top/new")) == ino {
			break
		}
		if i == 1000 {
			t.Skipf("SKIPPED: %s's filesystem gave no new directory inode number %d again", src, ino)
		}
	}
	settle()
	if _, err := os.Lstat(m("top/new")); err != nil {
		t.Fatal(err)
	}
	return ino
}

// TestDirectoryChmodSeenOnReusedInodeNumber: a directory made in SOURCE
// with the inode number of a removed one the kernel still holds a node of
// has its mode changes seen through the mount.
func TestDirectoryChmodSeenOnReusedInodeNumber(t *testing.T) {
	src, mnt, _, settle := mountWatched(t, watch.Auto)
	ino := reusedDir(t, src, mnt, settle)
	os.Chmod(filepath.Join(src, "top/new"), 0o700)
	settle()
	fi, err := os.Lstat(filepath.Join(mnt, "top/new"))
	if err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("chmod 700 of top/new (inode %d reused) in SOURCE not seen through the mount: %v %v", ino, fi.Mode(), err)
	}
}

// TestSecurityXattrSeenOnReusedInodeNumber: a security.* attribute added
// in SOURCE to a directory with the inode number of a removed one the
// kernel still holds a node of is seen through the mount, though the
// directory had none when asked before.
func TestSecurityXattrSeenOnReusedInodeNumber(t *testing.T) {
	src, mnt, _, settle := mountWatched(t, watch.Auto)
	ino := reusedDir(t, src, mnt, settle)
	buf := make([]byte, 64)
	if _, err := unix.Getxattr(filepath.Join(mnt, "top/new"), "security.gdsfstest", buf); err != unix.ENODATA {
		t.Fatalf("security.gdsfstest of a new directory: %v, want ENODATA", err)
	}
	if err := unix.Setxattr(filepath.Join(src, "top/new"), "security.gdsfstest", []byte("label"), 0); err != nil {
		t.Skipf("SKIPPED: %s takes no security.gdsfstest: %v", src, err)
	}
	settle()
	n, err := unix.Getxattr(filepath.Join(mnt, "top/new"), "security.gdsfstest", buf)
	if err != nil || string(buf[:n]) != "label" {
		t.Errorf("security.gdsfstest set on top/new (inode %d reused) in SOURCE not seen through the mount: %q %v", ino, buf[:max(n, 0)], err)
	}
}

// TestFilesystemMountedInSourceSeen: a filesystem mounted in SOURCE on a
// directory the kernel has cached (no change event is raised) is seen
// through the mount: its root's mode, and not the entries it hides.
func TestFilesystemMountedInSourceSeen(t *testing.T) {
	src, mnt, _, settle := mountWatched(t, watch.Auto)
	s, m := func(p string) string { return filepath.Join(src, p) }, func(p string) string { return filepath.Join(mnt, p) }
	os.Mkdir(s("d"), 0o755)
	os.WriteFile(s("d/under"), nil, 0o644)
	settle()
	if _, err := os.Lstat(m("d/under")); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("gdsfs-test", s("d"), "tmpfs", 0, "mode=0700"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(s("d"), unix.MNT_DETACH) })
	settle()
	if fi, err := os.Lstat(m("d")); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("d after a tmpfs of mode 0700 was mounted on it in SOURCE: %v %v, want mode 0700", fi.Mode(), err)
	}
	if _, err := os.Lstat(m("d/under")); !os.IsNotExist(err) {
		t.Errorf("d/under, hidden by the tmpfs mounted in SOURCE: %v, want not found", err)
	}
}

// fidOf is p's FID as fanotify reports it (the filesystem id is not
// needed to open a handle).
func fidOf(t *testing.T, p string) watch.FID {
	t.Helper()
	h, _, err := unix.NameToHandleAt(unix.AT_FDCWD, p, 0)
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 16, 16+h.Size())
	binary.NativeEndian.PutUint32(b[8:], uint32(h.Size()))
	binary.NativeEndian.PutUint32(b[12:], uint32(h.Type()))
	return watch.FID(append(b, h.Bytes()...))
}

// TestChangesOutsideSourceLoseNothing: a flood of changes to files
// outside SOURCE on SOURCE's filesystem (any local user's, in /tmp or a
// home directory, while the handler is busy) never counts as lost events
// of SOURCE, which would invalidate everything every user has cached.
func TestChangesOutsideSourceLoseNothing(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("SKIPPED: mounting FUSE needs root (run make test as root)")
	}
	q := &quietWatcher{}
	core, logs := observer.New(zap.WarnLevel)
	src, mnt := t.TempDir(), t.TempDir()
	srv, err := Mount(Config{Source: src, Mountpoint: mnt, Watch: q, Log: zap.New(core), Options: Options{
		Passthrough: PassthroughAuto, MaxRead: units.Size(1 << 20), EntryTimeout: time.Second, AttrTimeout: time.Second,
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := srv.Unmount(); err != nil {
			t.Error(err)
		}
		srv.Wait()
	})
	outside := filepath.Join(t.TempDir(), "f")
	os.WriteFile(outside, nil, 0o644)
	id := fidOf(t, outside)
	// None of the flood may reach the queue: however fast the handler
	// is, users' changes can come faster.
	for range 2*maxQueued + 1 {
		q.sub.Entries(watch.Change{Mask: unix.FAN_ATTRIB, Self: id})
	}
	srv.settle(q)
	srv.meta.mu.Lock()
	queued := srv.meta.queued
	srv.meta.mu.Unlock()
	if queued != 0 {
		t.Errorf("%d of %d changes to %s, outside SOURCE, were queued for the handler", queued, 2*maxQueued+1, outside)
	}
	if n := logs.FilterMessageSnippet("events lost").Len(); n != 0 {
		t.Errorf("%d changes to %s, outside SOURCE, invalidated everything cached %d times", 2*maxQueued+1, outside, n)
	}
}

// TestFilesystemUnmountedInSourceSeen: once a filesystem mounted in
// SOURCE on a directory is unmounted, the directory beneath is seen
// through the mount again, though the mounted one was looked up.
func TestFilesystemUnmountedInSourceSeen(t *testing.T) {
	src, mnt, _, settle := mountWatched(t, watch.Auto)
	s, m := func(p string) string { return filepath.Join(src, p) }, func(p string) string { return filepath.Join(mnt, p) }
	os.MkdirAll(s("a/d"), 0o755)
	os.WriteFile(s("a/d/under"), nil, 0o644)
	if err := unix.Mount("gdsfs-test", s("a/d"), "tmpfs", 0, "mode=0700"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(s("a/d"), unix.MNT_DETACH) })
	settle()
	if fi, err := os.Lstat(m("a/d")); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("a/d with a tmpfs of mode 0700 mounted on it: %v %v", fi.Mode(), err)
	}
	if err := unix.Unmount(s("a/d"), 0); err != nil {
		t.Fatal(err)
	}
	settle()
	if fi, err := os.Lstat(m("a/d")); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("a/d after the tmpfs on it was unmounted in SOURCE: %v %v, want mode 0755", fi.Mode(), err)
	}
	if _, err := os.Lstat(m("a/d/under")); err != nil {
		t.Errorf("a/d/under, no longer hidden: %v", err)
	}
}

// TestSelinuxLabelAbsentIsNotSupported: security.selinux that SOURCE's
// file does not have answers EOPNOTSUPP (`ls -l`, which asks for it of
// every file, then stops asking for the rest of the mount), on the first
// request and once known absent, with and without change detection; a
// label SOURCE's file has is answered, and set later it is seen.
func TestSelinuxLabelAbsentIsNotSupported(t *testing.T) {
	for _, w := range []string{watch.Auto, watch.Timestamps} {
		t.Run("watch="+w, func(t *testing.T) {
			src, mnt, _, settle := mountWatched(t, w)
			os.WriteFile(filepath.Join(src, "f"), []byte("x"), 0o644)
			buf := make([]byte, 64)
			for i := range 2 {
				if _, err := unix.Lgetxattr(filepath.Join(mnt, "f"), "security.selinux", buf); err != unix.EOPNOTSUPP {
					t.Fatalf("security.selinux of an unlabelled file, request %d: %v, want EOPNOTSUPP", i+1, err)
				}
			}
			if _, err := unix.Lgetxattr(filepath.Join(mnt, "f"), "security.gdsfstest", buf); err != unix.ENODATA {
				t.Fatalf("another security.* name the file lacks: %v, want ENODATA", err)
			}
			const label = "system_u:object_r:gdsfs_test_t:s0"
			if err := unix.Lsetxattr(filepath.Join(src, "f"), "security.selinux", []byte(label), 0); err != nil {
				t.Skipf("SKIPPED the labelled half: %s takes no security.selinux: %v", src, err)
			}
			settle()
			n, err := unix.Lgetxattr(filepath.Join(mnt, "f"), "security.selinux", buf)
			if err != nil || string(buf[:n]) != label {
				t.Errorf("security.selinux set in SOURCE: %q %v through the mount, want %q", buf[:max(n, 0)], err, label)
			}
		})
	}
}
