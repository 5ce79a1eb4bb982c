package bench

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestOpenWorkDir: a work directory another user owns or may write, or
// reached through another user's link, is refused by name; a missing one
// is made 0700.
func TestOpenWorkDir(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("SKIPPED: needs root (files of uid 65534)")
	}
	base := t.TempDir()
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	fresh := filepath.Join(base, "a", "b")
	if err := openWorkDir("--dir", fresh); err != nil {
		t.Fatalf("a missing work dir under a safe one: %v", err)
	}
	if st, err := os.Stat(fresh); err != nil || st.Mode().Perm() != 0o700 {
		t.Errorf("%s made with %v (%v), want 0700", fresh, st.Mode(), err)
	}
	theirs := filepath.Join(base, "theirs")
	open := filepath.Join(base, "open")
	sticky := filepath.Join(base, "sticky")
	link := filepath.Join(base, "link")
	for _, d := range []string{theirs, open, sticky} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	must(t, os.Chown(theirs, 65534, 65534))
	must(t, os.Chmod(open, 0o777))
	must(t, os.Chmod(sticky, 0o777|os.ModeSticky))
	must(t, os.Symlink(fresh, link))
	must(t, os.Lchown(link, 65534, 65534))
	for _, tc := range []struct{ dir, why string }{
		{theirs, "owned by uid 65534"},
		{filepath.Join(theirs, "sub"), "owned by uid 65534"},
		{open, "writable by group or other"},
		{filepath.Join(open, "sub"), "writable by group or other"},
		{sticky, "writable by group or other"},
		{link, "symbolic link of uid 65534"},
	} {
		err := openWorkDir("--dir", tc.dir)
		if err == nil || !strings.Contains(err.Error(), "--dir "+tc.dir) || !strings.Contains(err.Error(), tc.why) {
			t.Errorf("%s: got %v, want an error naming it: %s", tc.dir, err, tc.why)
		}
	}
	if err := openWorkDir("--dir", filepath.Join(sticky, "mine")); err != nil {
		t.Errorf("a work dir of ours under a sticky one: %v", err)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
