package ipc_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gdsfs/gdsfs/ipc"
)

// listenAt starts a server with its socket at sock and returns the error.
func listenAt(t *testing.T, sock string) error {
	t.Helper()
	f := newFixture(t, ipc.SharingShared)
	o := testOptions("shared")
	o.Socket = sock
	srv, err := ipc.Listen(ipc.Config{Source: f.src, Cache: f.cache, Options: o})
	if err == nil {
		srv.Close()
	}
	return err
}

// TestSocketDirIsMadePrivate: a socket directory the daemon makes lets
// others reach the socket but not list or write the directory.
func TestSocketDirIsMadePrivate(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "gdsfs-x")
	if err := listenAt(t, filepath.Join(dir, "s.sock")); err != nil {
		t.Fatal(err)
	}
	st, err := os.Lstat(dir)
	if err != nil || st.Mode().Perm() != 0o711 {
		t.Fatalf("socket directory: %v, %v; want mode 0711", st.Mode(), err)
	}
}

// TestSocketDirNotTrusted: a directory someone else could write (or a
// link in its place) is refused at start, naming it and why; nothing is
// bound in it.
func TestSocketDirNotTrusted(t *testing.T) {
	needRoot(t)
	base := t.TempDir()
	real := filepath.Join(base, "real")
	os.Mkdir(real, 0o700)
	cases := []struct {
		name, want string
		make       func(dir string)
	}{
		{"foreign owner", "owned by uid 65534", func(d string) { os.Mkdir(d, 0o700); os.Chown(d, 65534, 65534) }},
		{"world-writable", "writable by group or others", func(d string) { os.Mkdir(d, 0o700); os.Chmod(d, 0o1777) }},
		{"group-writable", "writable by group or others", func(d string) { os.Mkdir(d, 0o700); os.Chmod(d, 0o770) }},
		{"symlink", "symbolic link", func(d string) { os.Symlink(real, d) }},
		{"file", "not a directory", func(d string) { os.WriteFile(d, nil, 0o600) }},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := filepath.Join(base, strings.Repeat("d", i+1))
			c.make(dir)
			sock := filepath.Join(dir, "s.sock")
			err := listenAt(t, sock)
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), dir) {
				t.Fatalf("Listen in a %s directory: %v; want an error naming %s and %q", c.name, err, dir, c.want)
			}
			if _, err := os.Lstat(filepath.Join(real, "s.sock")); err == nil {
				t.Fatal("a socket was bound through the link")
			}
		})
	}
}

// TestSocketPathNotASocket: a link (or any non-socket) where the socket
// goes is refused, and what it names is left alone.
func TestSocketPathNotASocket(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "target")
	os.WriteFile(target, []byte("x"), 0o600)
	sock := filepath.Join(dir, "s.sock")
	os.Symlink(target, sock)
	err := listenAt(t, sock)
	if err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Fatalf("Listen with a link at the socket path: %v", err)
	}
	if st, _ := os.Stat(target); st.Mode().Perm() != 0o600 {
		t.Fatalf("the link's target became %v", st.Mode())
	}
}
