package client

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/proto"
)

// fstype is the mountinfo type of a gdsfs mount.
const fstype = "fuse.gdsfs"

// NotMountedError says a path is not on a gdsfs mount; errors.Is(err,
// syscall.ENODEV) works on it.
type NotMountedError struct {
	Path   string
	Reason string
}

func (e *NotMountedError) Error() string { return e.Path + ": not under a gdsfs mount: " + e.Reason }

// Unwrap gives the errno (ENODEV), as the Python client's NotMountedError.
func (e *NotMountedError) Unwrap() error { return syscall.ENODEV }

// mountEntry is one line of /proc/self/mountinfo.
type mountEntry struct {
	majmin, root, mountpoint, fstype string
	owner                            int // the user_id= super option; -1 when absent
}

// readMountinfo reads the mount table (MountinfoForTest replaces it).
var readMountinfo = func() ([]byte, error) { return os.ReadFile("/proc/self/mountinfo") }

// MountinfoForTest makes this package read its mount table from data
// instead of /proc/self/mountinfo until the returned function is called.
// It is for tests of a daemon served without a FUSE mount (package ipc's);
// programs never need it.
func MountinfoForTest(data []byte) (restore func()) {
	old := readMountinfo
	readMountinfo = func() ([]byte, error) { return data, nil }
	forget()
	return func() { readMountinfo = old; forget() }
}

// parseMountinfo reads mountinfo text: "id parent maj:min root mountpoint
// options... - fstype source superopts", with octal escapes in paths.
func parseMountinfo(data []byte) []mountEntry {
	var out []mountEntry
	s := bufio.NewScanner(bytes.NewReader(data))
	s.Buffer(make([]byte, 64<<10), 1<<20)
	for s.Scan() {
		f := strings.Split(s.Text(), " ")
		if len(f) < 7 {
			continue
		}
		sep := -1
		for i := 6; i < len(f); i++ {
			if f[i] == "-" {
				sep = i
				break
			}
		}
		if sep < 0 || sep+1 >= len(f) {
			continue
		}
		e := mountEntry{majmin: f[2], root: unescape(f[3]), mountpoint: unescape(f[4]), fstype: unescape(f[sep+1]), owner: -1}
		if sep+3 < len(f) {
			for _, o := range strings.Split(f[sep+3], ",") {
				if v, ok := strings.CutPrefix(o, "user_id="); ok {
					if n, err := strconv.ParseUint(v, 10, 32); err == nil {
						e.owner = int(n)
					}
				}
			}
		}
		out = append(out, e)
	}
	return out
}

// unescape undoes mountinfo's \NNN octal escapes (space, tab, newline,
// backslash).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 16); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// resolve makes path absolute with its symbolic links resolved, the
// file's own too, so the path sent names the file a plain open reads (a
// link that leads off the mount, or out of a bind mount of a directory of
// it, is not sent). The kernel walks it (an O_PATH open, named back by
// /proc/self/fd), so a `..` goes up from where the links before it lead.
// A last name that does not exist is kept, in the directory the walk of
// the rest reaches. Where the walk fails otherwise, a path with a `..`
// (whose text may name a file the walk never reaches: a link, a missing
// name or a file before the `..`), or one ending in `/`, fails with the
// walk's error; any other is resolved as far as this process may look
// (the links of the names that exist and that it may reach), the rest
// kept as it is: the daemon, which walks SOURCE as the caller, says what
// is wrong with it.
func resolve(path string) (string, error) {
	p, err := walked(path)
	if err == nil {
		return p, nil
	}
	dir, base := filepath.Split(path)
	if errors.Is(err, syscall.ENOENT) && base != "" && base != "." && base != ".." {
		if dir == "" {
			dir = "."
		}
		if d, derr := walked(dir); derr == nil {
			return filepath.Join(d, base), nil // a file not there (yet): its name in the directory walked
		}
	}
	if proto.HasDotDot(path) || strings.HasSuffix(path, "/") {
		return "", err
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", err
	}
	if real, err := filepath.EvalSymlinks(abs); err == nil {
		return real, nil
	}
	dir, base = filepath.Split(abs)
	if real, err := filepath.EvalSymlinks(dir); err == nil {
		dir = real
	}
	return filepath.Join(dir, base), nil
}

// walked is the path the kernel's walk of p reaches, every link followed.
func walked(p string) (string, error) {
	fd, err := unix.Open(p, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", &os.PathError{Op: "resolve", Path: p, Err: err}
	}
	defer unix.Close(fd)
	return os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
}

// target is where a path is leased from.
type target struct {
	socket, rel string
	mnt         string // the mount point the path is under
	owner       int    // the mount's user_id (-1: unknown): the uid its daemon must run as
}

// Locate finds the lease socket for path and the path to send: the
// nearest mount point at or above the file must be a gdsfs mount (a file
// on any other mount, even one inside a gdsfs mount, is refused); its
// .gdsfs/socket names the socket, or GDSFS_SOCKET when set, and the path
// relative to it is sent. A bind mount of a directory inside a gdsfs
// mount sends the path from the mount's root, whose .gdsfs/socket is
// read. A path outside every gdsfs mount is never sent anywhere.
func Locate(path string) (socket, rel string, err error) {
	t, err := find(path)
	return t.socket, t.rel, err
}

// find is Locate with the mount and its owner.
func find(path string) (target, error) {
	p, err := resolve(path)
	if err != nil {
		return target{}, err
	}
	data, err := readMountinfo()
	if err != nil {
		return target{}, fmt.Errorf("%s: %w", path, err)
	}
	return locateIn(path, p, parseMountinfo(data), os.Getenv("GDSFS_SOCKET"))
}

// locateIn is find for the resolved path p over a mount table; socket,
// when not "", is the lease socket to use (GDSFS_SOCKET) instead of the
// mount's .gdsfs/socket.
func locateIn(path, p string, entries []mountEntry, socket string) (target, error) {
	table := map[string]mountEntry{}
	for _, e := range entries {
		table[e.mountpoint] = e // the last mount on a path is the visible one
	}
	d := p
	var e mountEntry
	for {
		var ok bool
		if e, ok = table[d]; ok {
			break
		}
		parent := filepath.Dir(d)
		if parent == d {
			return target{}, &NotMountedError{Path: path, Reason: "no mount point found"}
		}
		d = parent
	}
	if e.fstype != fstype {
		return target{}, &NotMountedError{Path: path, Reason: fmt.Sprintf("it is on %s (%s)", e.mountpoint, e.fstype)}
	}
	rel, _ := filepath.Rel(d, p)
	ctl := d
	if e.root != "/" && e.root != "" {
		// A bind mount of a directory inside a gdsfs mount: the daemon
		// wants the path from its SOURCE root, and .gdsfs lives only at
		// the root.
		rel = filepath.Clean(filepath.Join(strings.TrimLeft(e.root, "/"), rel))
		ctl = ""
		for _, x := range entries {
			if x.majmin == e.majmin && x.root == "/" && x.fstype == fstype {
				ctl = x.mountpoint
			}
		}
		if ctl == "" && socket == "" {
			return target{}, &NotMountedError{Path: path, Reason: fmt.Sprintf(
				"on %s, a bind mount of %s inside a gdsfs mount whose root is not mounted here; set GDSFS_SOCKET to its lease socket", d, e.root)}
		}
	}
	t := target{socket: socket, rel: rel, mnt: d, owner: e.owner}
	if socket != "" {
		return t, nil
	}
	b, err := os.ReadFile(filepath.Join(ctl, ".gdsfs", "socket"))
	if err != nil {
		return target{}, fmt.Errorf("%s: gdsfs mount %s has no readable .gdsfs/socket (%w); set GDSFS_SOCKET", path, ctl, err)
	}
	socket, _, _ = strings.Cut(string(b), "\n")
	t.socket = strings.TrimSpace(socket)
	if t.socket == "" {
		return target{}, fmt.Errorf("%s: gdsfs mount %s: .gdsfs/socket is empty", path, ctl)
	}
	return t, nil
}
