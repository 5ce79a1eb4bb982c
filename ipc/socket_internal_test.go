package ipc

import (
	"net"
	"os"
	"path/filepath"
	"testing"
)

// TestOpenToAllNeverFollowsALink: the socket's chmod acts on the socket
// bound, never on a link put in its place between bind and chmod.
func TestOpenToAllNeverFollowsALink(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "target")
	os.WriteFile(target, []byte("x"), 0o600)
	path := filepath.Join(dir, "s.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	os.Remove(path)
	os.Symlink(target, path)
	if err := openToAll(path); err == nil {
		t.Fatal("openToAll through a link succeeded")
	}
	if st, _ := os.Stat(target); st.Mode().Perm() != 0o600 {
		t.Fatalf("the link's target became %v", st.Mode())
	}
	os.Remove(path)
	ln2, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer ln2.Close()
	if err := openToAll(path); err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Lstat(path); st.Mode().Perm() != 0o666 {
		t.Fatalf("socket mode %v, want 0666", st.Mode())
	}
}

// TestDefaultSocketFallback: root's socket is in /run/gdsfs; another
// uid's falls back to the temp directory, and choosing it makes nothing.
func TestDefaultSocketFallback(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	t.Setenv("XDG_RUNTIME_DIR", "")
	p := DefaultSocket("/mnt/x")
	if os.Geteuid() == 0 {
		if filepath.Dir(p) != "/run/gdsfs" {
			t.Fatalf("root's socket %s, want it in /run/gdsfs", p)
		}
		return
	}
	if filepath.Dir(filepath.Dir(p)) != tmp {
		t.Fatalf("socket %s, want it under %s", p, tmp)
	}
	if ents, _ := os.ReadDir(tmp); len(ents) != 0 {
		t.Fatalf("DefaultSocket made %v", ents)
	}
}
