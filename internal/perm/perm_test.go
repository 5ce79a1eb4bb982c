package perm

import (
	"errors"
	"os"
	"syscall"
	"testing"
)

func TestCanRead(t *testing.T) {
	st := &syscall.Stat_t{Uid: 1000, Gid: 100}
	for _, tc := range []struct {
		mode uint32
		cred Cred
		want bool
	}{
		{0o400, Cred{UID: 1000}, true},
		{0o040, Cred{UID: 1000, GIDs: []uint32{100}}, false}, // owner bits decide for the owner
		{0o040, Cred{UID: 2000, GIDs: []uint32{5, 100}}, true},
		{0o004, Cred{UID: 2000, GIDs: []uint32{100}}, false}, // group bits decide for members
		{0o004, Cred{UID: 2000, GIDs: []uint32{7}}, true},
		{0o000, Cred{UID: 0}, true},
		{0o600, Cred{UID: 2000, GIDs: []uint32{100}}, false},
	} {
		st.Mode = syscall.S_IFREG | tc.mode
		if got := CanRead(st, tc.cred); got != tc.want {
			t.Errorf("mode %o cred %+v: CanRead = %v, want %v", tc.mode, tc.cred, got, tc.want)
		}
	}
}

func TestCanSearch(t *testing.T) {
	st := &syscall.Stat_t{Uid: 1000, Gid: 100, Mode: syscall.S_IFDIR | 0o750}
	if !CanSearch(st, Cred{UID: 1000}) || !CanSearch(st, Cred{UID: 5, GIDs: []uint32{100}}) || CanSearch(st, Cred{UID: 5}) {
		t.Fatal("search bits not applied per class")
	}
	st.Mode = syscall.S_IFDIR | 0o600
	if CanSearch(st, Cred{UID: 0}) {
		t.Fatal("root searched a directory with no execute bit")
	}
}

func TestForPID(t *testing.T) {
	c, err := ForPID(int32(os.Getpid()), uint32(os.Geteuid()), uint32(os.Getegid()))
	if err != nil {
		t.Fatal(err)
	}
	groups, _ := os.Getgroups()
	for _, g := range groups {
		found := false
		for _, h := range c.GIDs {
			found = found || h == uint32(g)
		}
		if !found {
			t.Errorf("group %d missing from %v", g, c.GIDs)
		}
	}
	if _, err := ForPID(-5, 0, 0); err == nil {
		t.Error("ForPID of a missing process succeeded")
	}
}

func TestResolve(t *testing.T) {
	root := t.TempDir()
	os.MkdirAll(root+"/private/sub", 0o700)
	os.WriteFile(root+"/private/sub/file", []byte("x"), 0o644)
	os.MkdirAll(root+"/pub/v3", 0o755)
	os.WriteFile(root+"/pub/v3/data", []byte("x"), 0o644)
	os.MkdirAll(root+"/u", 0o755)
	os.Symlink("../private/sub/file", root+"/u/l")
	os.Symlink("v3", root+"/pub/latest")
	os.Symlink("/etc/passwd", root+"/u/abs")
	os.Symlink("../../outside", root+"/u/out")
	os.Symlink("loop", root+"/u/loop")
	os.Chmod(root, 0o755)
	nobody := Cred{UID: 65534, GIDs: []uint32{65534}}
	for _, tc := range []struct {
		rel, want string
		errno     syscall.Errno
	}{
		{"pub/latest/data", "pub/v3/data", 0},
		{"./pub//v3/../v3/data", "pub/v3/data", 0},
		{"private/sub/file", "", syscall.EACCES},
		{"u/l", "", syscall.EACCES}, // the link leads through private/
		{"u/abs", "", syscall.EXDEV},
		{"u/out", "", syscall.EXDEV},
		{"u/loop", "", syscall.ELOOP},
		{"../x", "", syscall.EXDEV},
		{"pub/v3/data/x", "", syscall.ENOTDIR},
		{"pub/missing", "", syscall.ENOENT},
	} {
		got, st, err := Resolve(root, tc.rel, nobody)
		if tc.errno != 0 {
			if !errors.Is(err, tc.errno) {
				t.Errorf("Resolve(%q) = %q, %v; want %v", tc.rel, got, err, tc.errno)
			}
			continue
		}
		if err != nil || got != tc.want || st == nil {
			t.Errorf("Resolve(%q) = %q, %v; want %q", tc.rel, got, err, tc.want)
		}
	}
	if got, _, err := Resolve(root, "u/l", Cred{UID: 0}); err != nil || got != "private/sub/file" {
		t.Errorf("root resolving u/l: %q, %v", got, err)
	}
}
