package integration

import (
	"os"
	"path/filepath"
	"testing"
)

// controlUserTree is a SOURCE tree for uid 65534: a file it may read, a
// root file it may not, and a readable file in a directory it may not
// search.
func controlUserTree(t *testing.T) string {
	t.Helper()
	src := userDir(t)
	randomFile(t, filepath.Join(src, "pub/open.bin"), 5000, 1)
	randomFile(t, filepath.Join(src, "pub/secret.bin"), 6000, 2)
	randomFile(t, filepath.Join(src, "private/hidden.bin"), 7000, 3)
	for p, mode := range map[string]os.FileMode{"pub": 0o755, "pub/open.bin": 0o644, "pub/secret.bin": 0o600, "private": 0o700, "private/hidden.bin": 0o644} {
		if err := os.Chmod(filepath.Join(src, p), mode); err != nil {
			t.Fatal(err)
		}
	}
	return src
}

// prefetches is the daemon's count of prefetches queued (counted as the
// control write queues one).
func prefetches(t *testing.T, m *mount) float64 {
	t.Helper()
	return statsOf(t, m)["prefetches"].(float64)
}

// TestControlWritesAsAnotherUser: on an allow_other mount, uid 65534 may
// write to .gdsfs/prefetch and .gdsfs/evict the paths of regular files it
// can read, and is refused (EACCES, nothing queued or dropped) the others:
// a root file of mode 0600, a file in a directory it may not search, by
// relative or absolute path. Its write to a read-only control is refused
// too.
func TestControlWritesAsAnotherUser(t *testing.T) {
	needMount(t)
	need(t, "getfattr")
	src := controlUserTree(t)
	m := startMount(t, src, "fuse.allow_other=true", "staging.prefetch=manual")
	os.Chmod(filepath.Dir(m.mnt), 0o755)
	ctl := func(name string) string { return m.path(".gdsfs/" + name) }
	for _, p := range []string{"pub/secret.bin", "private/hidden.bin", m.path("pub/secret.bin"), m.path("private/hidden.bin")} {
		before := prefetches(t, m)
		if got := fsuser(t, user(), "write", ctl("prefetch"), p+"\n"); got != "EACCES" {
			t.Errorf("uid 65534 prefetching %s: %s, want EACCES", p, got)
		}
		if n := prefetches(t, m); n != before {
			t.Errorf("uid 65534's refused prefetch of %s was queued (prefetches %v, was %v)", p, n, before)
		}
	}
	for _, rel := range []string{"pub/secret.bin", "private/hidden.bin"} {
		if got := xattr(t, m.path(rel), "state"); got != "absent" {
			t.Errorf("%s after uid 65534's refused prefetch: %q, want absent", rel, got)
		}
	}
	if got := fsuser(t, user(), "write", ctl("prefetch"), "pub/open.bin\n"); got != "OK" {
		t.Fatalf("uid 65534 prefetching a file it may read: %s, want OK", got)
	}
	waitState(t, m.path("pub/open.bin"), "resident")

	// Evict: root stages the files uid 65534 may not read; its evicts of
	// them are refused and leave them staged (an evict acts before the
	// write returns).
	writeControl(t, m, "prefetch", "pub/secret.bin", 0)
	writeControl(t, m, "prefetch", "private/hidden.bin", 0)
	waitState(t, m.path("pub/secret.bin"), "resident")
	waitState(t, m.path("private/hidden.bin"), "resident")
	for _, p := range []string{"pub/secret.bin", "private/hidden.bin", m.path("pub/secret.bin")} {
		if got := fsuser(t, user(), "write", ctl("evict"), p+"\n"); got != "EACCES" {
			t.Errorf("uid 65534 evicting %s: %s, want EACCES", p, got)
		}
	}
	for _, rel := range []string{"pub/secret.bin", "private/hidden.bin"} {
		if got := xattr(t, m.path(rel), "state"); got != "resident" {
			t.Errorf("%s after uid 65534's refused evict: %q, want resident", rel, got)
		}
	}
	if got := fsuser(t, user(), "write", ctl("evict"), "pub/open.bin\n"); got != "OK" {
		t.Fatalf("uid 65534 evicting a file it may read: %s, want OK", got)
	}
	if got := xattr(t, m.path("pub/open.bin"), "state"); got != "absent" {
		t.Errorf("pub/open.bin after uid 65534's evict: %q, want absent", got)
	}
	if got := fsuser(t, user(), "write", ctl("stats"), "x\n"); got != "EACCES" {
		t.Errorf("uid 65534 writing .gdsfs/stats: %s, want EACCES", got)
	}
}

// TestControlWritesWithoutAllowOther: without allow_other the mount is
// the mounting user's (root's) only: uid 65534's writes to
// .gdsfs/prefetch and .gdsfs/evict are refused (EACCES), even of a file it
// may read, and change nothing; root's go through.
func TestControlWritesWithoutAllowOther(t *testing.T) {
	needMount(t)
	need(t, "getfattr")
	src := controlUserTree(t)
	m := startMount(t, src, "staging.prefetch=manual")
	os.Chmod(filepath.Dir(m.mnt), 0o755)
	if got := fsuser(t, user(), "write", m.path(".gdsfs/prefetch"), "pub/open.bin\n"); got != "EACCES" {
		t.Errorf("uid 65534 prefetching through a mount without allow_other: %s, want EACCES", got)
	}
	if n := prefetches(t, m); n != 0 {
		t.Errorf("prefetches = %v after uid 65534's refused prefetch, want 0", n)
	}
	writeControl(t, m, "prefetch", "pub/open.bin", 0)
	waitState(t, m.path("pub/open.bin"), "resident")
	if got := fsuser(t, user(), "write", m.path(".gdsfs/evict"), "pub/open.bin\n"); got != "EACCES" {
		t.Errorf("uid 65534 evicting through a mount without allow_other: %s, want EACCES", got)
	}
	if got := xattr(t, m.path("pub/open.bin"), "state"); got != "resident" {
		t.Errorf("pub/open.bin after uid 65534's refused evict: %q, want resident", got)
	}
}
