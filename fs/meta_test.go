package fs

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/internal/units"
	"github.com/gdsfs/gdsfs/staging/watch"
)

// mountWatched mounts a fresh SOURCE with change detection in mode.
func mountWatched(t *testing.T, mode string) (src, mnt string, srv *Server, settle func()) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("SKIPPED: mounting FUSE and fanotify need root (run make test as root)")
	}
	w := watch.New(mode, nil)
	t.Cleanup(w.Close)
	src, mnt = t.TempDir(), t.TempDir()
	var err error
	srv, err = Mount(Config{Source: src, Mountpoint: mnt, Watch: w, Options: Options{
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
	if mode == watch.Auto && !srv.meta.on {
		t.Fatalf("no entry events on %s: %s", src, srv.meta.why)
	}
	return src, mnt, srv, func() { srv.settle(w) }
}

func lstat(t *testing.T, p string) (os.FileInfo, error) {
	t.Helper()
	return os.Lstat(p)
}

// TestSourceChangesSeenAtOnce: entries and attributes the kernel caches
// for long are seen changed through the mount as soon as the daemon has
// handled SOURCE's event.
func TestSourceChangesSeenAtOnce(t *testing.T) {
	src, mnt, _, settle := mountWatched(t, watch.Auto)
	s, m := func(p string) string { return filepath.Join(src, p) }, func(p string) string { return filepath.Join(mnt, p) }
	os.Mkdir(s("d"), 0o755)
	os.WriteFile(s("d/a"), []byte("a"), 0o644)
	os.WriteFile(s("d/b"), []byte("b"), 0o644)
	names := func() []string {
		es, err := os.ReadDir(m("d"))
		if err != nil {
			t.Fatal(err)
		}
		var r []string
		for _, e := range es {
			r = append(r, e.Name())
		}
		return r
	}
	mode := func(p string) os.FileMode {
		fi, err := lstat(t, m(p))
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		return fi.Mode()
	}
	// Cache everything first.
	names()
	mode("d/a")
	mode("d/b")
	if _, err := os.ReadFile(m("d/a")); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		do    func() error
		check func() string // "" when the mount shows the change
	}{
		{"chmod 600", func() error { return os.Chmod(s("d/a"), 0o600) }, func() string {
			if got := mode("d/a").Perm(); got != 0o600 {
				return "mode " + got.String()
			}
			return ""
		}},
		{"chown", func() error { return os.Chown(s("d/a"), 1234, 1234) }, func() string {
			fi, _ := lstat(t, m("d/a"))
			if st := fi.Sys().(*syscall.Stat_t); st.Uid != 1234 {
				return "uid not 1234"
			}
			return ""
		}},
		{"write", func() error { return os.WriteFile(s("d/a"), []byte("longer"), 0) }, func() string {
			fi, _ := lstat(t, m("d/a"))
			if fi.Size() != 6 {
				return "size not 6"
			}
			return ""
		}},
		{"create", func() error { return os.WriteFile(s("d/c"), nil, 0o644) }, func() string {
			if _, err := os.Lstat(m("d/c")); err != nil {
				return err.Error()
			}
			if n := names(); len(n) != 3 {
				return "listing " + filepath.Join(n...)
			}
			return ""
		}},
		{"unlink", func() error { return os.Remove(s("d/b")) }, func() string {
			if _, err := os.Lstat(m("d/b")); !os.IsNotExist(err) {
				return "d/b still there"
			}
			if n := names(); len(n) != 2 {
				return "listing " + filepath.Join(n...)
			}
			return ""
		}},
		{"rename", func() error { return os.Rename(s("d/c"), s("e")) }, func() string {
			if _, err := os.Lstat(m("d/c")); !os.IsNotExist(err) {
				return "d/c still there"
			}
			if _, err := os.Lstat(m("e")); err != nil {
				return err.Error()
			}
			return ""
		}},
		{"hard link chmod", func() error {
			if err := os.Link(s("d/a"), s("l")); err != nil {
				return err
			}
			settle()
			mode("l")
			return os.Chmod(s("l"), 0o640)
		}, func() string {
			if got := mode("d/a").Perm(); got != 0o640 {
				return "d/a mode " + got.String()
			}
			return ""
		}},
		{"directory chmod", func() error { return os.Chmod(s("d"), 0o700) }, func() string {
			if got := mode("d").Perm(); got != 0o700 {
				return "mode " + got.String()
			}
			return ""
		}},
		{"rmdir", func() error { os.RemoveAll(s("d")); return nil }, func() string {
			if _, err := os.Lstat(m("d")); !os.IsNotExist(err) {
				return "d still there"
			}
			return ""
		}},
	} {
		if err := tc.do(); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		settle()
		if why := tc.check(); why != "" {
			t.Errorf("%s in SOURCE not seen through the mount: %s", tc.name, why)
		}
	}
}

// TestTimestampsModeKeepsShortTimeouts: without entry events the kernel
// caches for fuse.entry_timeout and fuse.attr_timeout only.
func TestTimestampsModeKeepsShortTimeouts(t *testing.T) {
	src, mnt, srv, _ := mountWatched(t, watch.Timestamps)
	os.WriteFile(filepath.Join(src, "a"), nil, 0o644)
	if _, err := os.Lstat(filepath.Join(mnt, "a")); err != nil {
		t.Fatal(err)
	}
	if srv.meta.on || !strings.Contains(srv.meta.why, "timestamps") {
		t.Errorf("meta caching on=%v why=%q, want off because of timestamps", srv.meta.on, srv.meta.why)
	}
}

// quietWatcher says SOURCE reports changes but reports none itself: the
// test decides what the subscriber hears.
type quietWatcher struct{ sub watch.Subscriber }

func (q *quietWatcher) ProbeEntries(*os.File, uint64) (bool, string) { return true, "" }
func (q *quietWatcher) Subscribe(s watch.Subscriber)                 { q.sub = s }
func (q *quietWatcher) Drain()                                       {}

// mountQuiet mounts a fresh SOURCE whose changes the test reports
// (quietWatcher), the kernel caching entries and attributes for timeout
// where none is reported.
func mountQuiet(t *testing.T, timeout time.Duration) (src, mnt string, srv *Server, q *quietWatcher) {
	t.Helper()
	q = &quietWatcher{}
	src, mnt = t.TempDir(), t.TempDir()
	srv, err := Mount(Config{Source: src, Mountpoint: mnt, Watch: q, Options: Options{
		Passthrough: PassthroughAuto, MaxRead: units.Size(1 << 20), EntryTimeout: timeout, AttrTimeout: timeout,
	}})
	if err != nil {
		t.Fatal(err)
	}
	unmountAtEnd(t, srv)
	return src, mnt, srv, q
}

// TestLostEventsInvalidateEverything: after an overflow, every entry and
// attribute the kernel holds is asked for again.
func TestLostEventsInvalidateEverything(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("SKIPPED: mounting FUSE needs root (run make test as root)")
	}
	src, mnt, srv, q := mountQuiet(t, time.Second)
	os.Mkdir(filepath.Join(src, "d"), 0o755)
	os.WriteFile(filepath.Join(src, "d/a"), nil, 0o644)
	if _, err := os.ReadDir(filepath.Join(mnt, "d")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(mnt, "d/a")); err != nil {
		t.Fatal(err)
	}
	os.Chmod(filepath.Join(src, "d/a"), 0o600)
	os.WriteFile(filepath.Join(src, "d/b"), nil, 0o644)
	q.sub.Lost()
	srv.settle(q)
	if fi, err := os.Lstat(filepath.Join(mnt, "d/a")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("d/a after lost events: %v %v, want mode 0600", fi.Mode(), err)
	}
	if es, err := os.ReadDir(filepath.Join(mnt, "d")); err != nil || len(es) != 2 {
		t.Errorf("d after lost events: %d entries %v, want 2", len(es), err)
	}
}

// TestChangeEventKeepsOpenFilesPath: a change event naming the entry of
// a file open through the mount (its creation, reported after the open)
// leaves the open file's path as it is: /proc/PID/fd names it, not
// "(deleted)" (loaders find a file's path from its descriptor there).
// The entry is still looked up again: a file that replaced it, or its
// removal, is seen.
func TestChangeEventKeepsOpenFilesPath(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("SKIPPED: mounting FUSE needs root (run make test as root)")
	}
	src, mnt, srv, q := mountQuiet(t, time.Hour)
	for _, dir := range []string{".", "d"} {
		s, m := filepath.Join(src, dir), filepath.Join(mnt, dir)
		os.MkdirAll(s, 0o755)
		if err := os.WriteFile(filepath.Join(s, "f"), []byte("f"), 0o644); err != nil {
			t.Fatal(err)
		}
		f, err := os.Open(filepath.Join(m, "f"))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		q.sub.Entries(watch.Change{Mask: unix.FAN_CREATE, Dir: srv.fidOf(t, s), Name: "f", Self: srv.fidOf(t, filepath.Join(s, "f"))})
		srv.settle(q)
		if l, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", f.Fd())); err != nil || l != filepath.Join(m, "f") {
			t.Errorf("after an event of its creation, the open file's path is %q (%v), want %s", l, err, filepath.Join(m, "f"))
		}
		// Replaced in SOURCE: the name is another file.
		os.WriteFile(filepath.Join(s, "g"), []byte("gg"), 0o644)
		if err := os.Rename(filepath.Join(s, "g"), filepath.Join(s, "f")); err != nil {
			t.Fatal(err)
		}
		q.sub.Entries(watch.Change{Mask: unix.FAN_MOVED_TO, Dir: srv.fidOf(t, s), Name: "f", Self: srv.fidOf(t, filepath.Join(s, "f"))})
		srv.settle(q)
		if fi, err := os.Stat(filepath.Join(m, "f")); err != nil || fi.Size() != 2 {
			t.Errorf("stat of %s/f after it was replaced in SOURCE and its event: %v %v, want the new file's 2 bytes", dir, fi, err)
		}
		os.Remove(filepath.Join(s, "f"))
		q.sub.Entries(watch.Change{Mask: unix.FAN_DELETE, Dir: srv.fidOf(t, s), Name: "f"})
		srv.settle(q)
		if _, err := os.Stat(filepath.Join(m, "f")); !os.IsNotExist(err) {
			t.Errorf("stat of %s/f removed in SOURCE, after its event: %v, want ENOENT", dir, err)
		}
	}
}

// fidOf is what change events name the file at p of SOURCE's
// filesystem by.
func (s *Server) fidOf(t *testing.T, p string) watch.FID {
	t.Helper()
	fd, err := unix.Open(p, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	id, err := watch.FileFID(fd, s.meta.fsid)
	if err != nil {
		t.Fatal(err)
	}
	return id
}
