package access

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// TestOpenLongerThanPathMax: a path beneath SOURCE of twice PATH_MAX opens
// (resolved in pieces); a link on the way is refused under NoSymlinks, and
// under Beneath one may not climb out of the piece it is in.
func TestOpenLongerThanPathMax(t *testing.T) {
	src := t.TempDir()
	r, err := OpenRoot(src)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var parts []string
	for len(strings.Join(parts, "/")) < 2*unix.PathMax {
		parts = append(parts, strings.Repeat(string(rune('a'+len(parts)%26)), 200))
		d, err := r.Open(strings.Join(parts[:len(parts)-1], "/"), unix.O_PATH|unix.O_DIRECTORY, 0, NoSymlinks)
		if err != nil {
			t.Fatalf("open %d levels deep: %v", len(parts)-1, err)
		}
		err = unix.Mkdirat(int(d.Fd()), parts[len(parts)-1], 0o755)
		if err == nil && len(parts) == 22 {
			// In the second piece's first directory but one (the first
			// piece is 20 names long): a link to the piece's first
			// directory, and one above it.
			err = errors.Join(unix.Symlinkat("..", int(d.Fd()), "up"), unix.Symlinkat("../..", int(d.Fd()), "upup"))
		}
		d.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	leaf := strings.Join(parts, "/") + "/f"
	f, err := r.Open(leaf, os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o644, NoSymlinks)
	if err != nil {
		t.Fatalf("create %d bytes deep: %v", len(leaf), err)
	}
	f.Close()
	if f, err = r.Open(leaf, os.O_RDONLY, 0, NoSymlinks); err != nil {
		t.Fatalf("open %d bytes deep: %v", len(leaf), err)
	}
	f.Close()
	if _, err := r.Open(leaf+"/x", os.O_RDONLY, 0, NoSymlinks); !errors.Is(err, syscall.ENOTDIR) {
		t.Errorf("below a file: %v, want ENOTDIR", err)
	}
	up := strings.Join(parts[:21], "/") + "/up/" + strings.Join(parts[20:], "/")
	if len(up) < unix.PathMax {
		t.Fatalf("a path of %d bytes: too short for the test", len(up))
	}
	if _, err := r.Open(up, unix.O_PATH, 0, NoSymlinks); !errors.Is(err, syscall.ELOOP) {
		t.Errorf("a link on the way under NoSymlinks: %v, want ELOOP", err)
	}
	if d, err := r.Open(up, unix.O_PATH, 0, Beneath); err != nil {
		t.Errorf("a link to its piece's first directory under Beneath: %v", err)
	} else {
		d.Close()
	}
	upup := strings.Join(parts[:21], "/") + "/upup/" + strings.Join(parts[19:], "/")
	if _, err := r.Open(upup, unix.O_PATH, 0, Beneath); !errors.Is(err, syscall.EXDEV) {
		t.Errorf("a link above its piece's first directory: %v, want EXDEV", err)
	}
}

// TestSourceIsTheDirectory: a Root keeps the directory it opened. Renamed
// away, it is still the one served; removed, nothing is found in it, even
// with a new directory at its path.
func TestSourceIsTheDirectory(t *testing.T) {
	parent := t.TempDir()
	dir := filepath.Join(parent, "src")
	write(t, filepath.Join(dir, "a"), 0o644)
	r, err := OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if err := os.Rename(dir, dir+".old"); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, "b"), 0o644)
	if f, err := r.Open("a", os.O_RDONLY, 0, Beneath); err != nil {
		t.Errorf("open in SOURCE renamed away: %v", err)
	} else {
		f.Close()
	}
	if _, err := r.Open("b", os.O_RDONLY, 0, Beneath); !errors.Is(err, syscall.ENOENT) {
		t.Errorf("open of a file of the directory made at SOURCE's path: %v, want ENOENT", err)
	}
	if err := os.RemoveAll(dir + ".old"); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Open("a", os.O_RDONLY, 0, Beneath); !errors.Is(err, syscall.ENOENT) {
		t.Errorf("open in a removed SOURCE: %v, want ENOENT", err)
	}
	r.Close()
	if _, err := r.Open(".", unix.O_PATH, 0, Beneath); !errors.Is(err, os.ErrClosed) {
		t.Errorf("open after Close: %v, want os.ErrClosed", err)
	}
}
