package client

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// mountCases is proto/testdata/mounts.json, which the Python client's
// tests read too.
type mountCases struct {
	Mountinfo []string          `json:"mountinfo"`
	Names     map[string]string `json:"names"`
	Sockets   map[string]string `json:"sockets"`
	Cases     []struct {
		Path, Socket, Rel, Error string
	} `json:"cases"`
}

func escapeMount(p string) string {
	return strings.NewReplacer(`\`, `\134`, " ", `\040`, "\t", `\011`, "\n", `\012`).Replace(p)
}

func TestLocateSharedCases(t *testing.T) {
	b, err := os.ReadFile("../proto/testdata/mounts.json")
	if err != nil {
		t.Fatal(err)
	}
	var mc mountCases
	if err := json.Unmarshal(b, &mc); err != nil {
		t.Fatal(err)
	}
	root, _ := filepath.EvalSymlinks(t.TempDir())
	dirs := map[string]string{"root": root}
	for k, name := range mc.Names {
		dirs[k] = filepath.Join(root, name)
		os.MkdirAll(dirs[k], 0o755)
	}
	for k, s := range mc.Sockets {
		os.MkdirAll(filepath.Join(dirs[k], ".gdsfs"), 0o755)
		os.WriteFile(filepath.Join(dirs[k], ".gdsfs", "socket"), []byte(s+"\n"), 0o644)
	}
	fill := func(s string, esc bool) string {
		for k, d := range dirs {
			if esc {
				d = escapeMount(d)
			}
			s = strings.ReplaceAll(s, "{"+k+"}", d)
		}
		return s
	}
	var info []string
	for _, l := range mc.Mountinfo {
		info = append(info, fill(l, true))
	}
	entries := parseMountinfo([]byte(strings.Join(info, "\n")))
	if len(entries) != len(mc.Mountinfo) || entries[5].mountpoint != dirs["sp"] || entries[4].root != "/data" {
		t.Fatalf("parsed %d entries: %+v", len(entries), entries)
	}
	for _, c := range mc.Cases {
		p := fill(c.Path, false)
		got, err := locateIn(p, p, entries, "")
		sock, rel := got.socket, got.rel
		if c.Error != "" {
			var nm *NotMountedError
			if err == nil || !strings.Contains(err.Error(), c.Error) || !errors.As(err, &nm) || !errors.Is(err, syscall.ENODEV) {
				t.Errorf("%s: %v, want a NotMountedError (ENODEV) mentioning %q", c.Path, err, c.Error)
			}
			continue
		}
		if err != nil || sock != c.Socket || rel != c.Rel {
			t.Errorf("%s: (%q, %q, %v), want (%q, %q)", c.Path, sock, rel, err, c.Socket, c.Rel)
		}
	}
}

func TestUnescape(t *testing.T) {
	if got := unescape(`a\040b\134c\012\011d`); got != "a b\\c\n\td" {
		t.Fatalf("%q", got)
	}
}

// TestResolveWalksDotDotAfterTheLinks: a `..` after a symbolic link goes
// up from where the link leads, as a plain open does, not back to the
// link's own directory; relative paths too.
func TestResolveWalksDotDotAfterTheLinks(t *testing.T) {
	dir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"sub/deep", "sub/f", "f"} {
		if p == "sub/deep" {
			if err := os.MkdirAll(filepath.Join(dir, p), 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.WriteFile(filepath.Join(dir, p), []byte(p), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("sub/deep", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	want := filepath.Join(dir, "sub", "f")
	if got, err := resolve(filepath.Join(dir, "link") + "/../f"); err != nil || got != want {
		t.Fatalf("resolve(link/../f) = %q, %v; want %q (where a plain open lands)", got, err, want)
	}
	t.Chdir(dir)
	if got, err := resolve("link/../f"); err != nil || got != want {
		t.Fatalf("resolve of the relative link/../f = %q, %v; want %q", got, err, want)
	}
	if got, err := resolve("link/../missing"); err != nil || got != filepath.Join(dir, "sub", "missing") {
		t.Fatalf("resolve of a missing file after link/.. = %q, %v; want it beside sub/f", got, err)
	}
}

// TestResolveNeverLandsWhereTheKernelsWalkFails: where the kernel's walk
// of a path fails (a name missing before a `..`, a file before one, or a
// missing name after a `..` that follows a link), resolve answers no
// existing other file (the one the path's text names).
func TestResolveNeverLandsWhereTheKernelsWalkFails(t *testing.T) {
	dir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"sub/deep", "other"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"other/f", "sub/deep/f", "g"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte(f), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("sub/deep", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{
		"link/../other/f",   // kernel: sub/other/f, ENOENT; text: other/f exists
		"link/missing/../f", // kernel: ENOENT; text: link/f = sub/deep/f exists
		"g/../other/f",      // kernel: ENOTDIR; text: other/f
	} {
		path := filepath.Join(dir, "x")[:len(dir)+1] + p
		if _, err := os.Stat(path); err == nil {
			t.Fatalf("%s: the kernel reaches a file; the test is wrong", p)
		}
		got, err := resolve(path)
		if err != nil {
			continue
		}
		if _, serr := os.Stat(got); serr == nil {
			t.Errorf("resolve(%s) = %s, an existing file, where a plain open of the path fails", p, got)
		}
	}
}
