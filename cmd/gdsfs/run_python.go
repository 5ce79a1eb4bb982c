package main

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs"
	"github.com/gdsfs/gdsfs/python"
)

// pythonDir is the directory holding the gdsfs Python package that
// `gdsfs run` puts on PYTHONPATH: $GDSFS_PYTHON_DIR, else the first of
// ../python and ../share/gdsfs/python beside the binary that holds the
// package, else the embedded copy. A directory that fails
// trustedPackage is refused with one line on warn, and the embedded
// copy is used instead.
func pythonDir(warn io.Writer) (string, error) {
	var cands []string
	if d := os.Getenv("GDSFS_PYTHON_DIR"); d != "" {
		if !hasPackage(d) {
			return "", fmt.Errorf("GDSFS_PYTHON_DIR=%s: no sitecustomize.py and gdsfs/_bootstrap/boot.py there", d)
		}
		cands = []string{d}
	} else if exe, err := os.Executable(); err == nil {
		if exe, err = filepath.EvalSymlinks(exe); err == nil {
			base := filepath.Dir(filepath.Dir(exe))
			for _, d := range []string{filepath.Join(base, "python"), filepath.Join(base, "share", "gdsfs", "python")} {
				if hasPackage(d) {
					cands = []string{d}
					break
				}
			}
		}
	}
	for _, d := range cands {
		real, err := trustedPackage(d)
		if err == nil {
			return real, nil
		}
		fmt.Fprintf(warn, "gdsfs run: not loading the Python package in %s: %v; using the copy built into gdsfs\n", d, err)
	}
	return embeddedPython(warn, python.Files, gdsfs.Version)
}

func hasPackage(dir string) bool {
	for _, f := range []string{"sitecustomize.py", filepath.Join("gdsfs", "_bootstrap", "boot.py")} {
		st, err := os.Stat(filepath.Join(dir, f))
		if err != nil || !st.Mode().IsRegular() {
			return false
		}
	}
	return true
}

// trusted says whether uid may own what `gdsfs run` loads: root or the
// caller.
func trusted(uid uint32) bool { return uid == 0 || int(uid) == os.Geteuid() }

// trustedPackage returns dir's real path when only root and the caller
// can change anything Python would read from it: every directory from /
// down to dir is owned by one of them and writable by no one else (a
// sticky directory such as /tmp may be writable by others above dir: its
// entries can be replaced only by their owners), and so is every entry
// under dir, none of them a symbolic link. Nobody else can then change
// what was checked before Python reads it; the real path is what goes on
// PYTHONPATH, so no link is followed later.
func trustedPackage(dir string) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	real, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return "", err
	}
	m := &mounts{}
	if err := trustedAncestors(real, m); err != nil {
		return "", err
	}
	err = filepath.WalkDir(real, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		st, err := os.Lstat(p)
		if err != nil {
			return err
		}
		return checkEntry(p, st, false, m)
	})
	if err != nil {
		return "", err
	}
	return real, nil
}

// trustedAncestors checks / and every directory above path (path itself
// not included) as trustedPackage does.
func trustedAncestors(path string, m *mounts) error {
	var up []string
	for p := filepath.Dir(filepath.Clean(path)); ; p = filepath.Dir(p) {
		up = append(up, p)
		if p == "/" || p == "." {
			break
		}
	}
	for i := len(up) - 1; i >= 0; i-- {
		st, err := os.Lstat(up[i])
		if err != nil {
			return err
		}
		if err := checkEntry(up[i], st, true, m); err != nil {
			return err
		}
	}
	return nil
}

// checkEntry says why path (its Lstat st) is not trusted; above: it is a
// directory above what is loaded, where a sticky bit makes write access
// by others harmless.
func checkEntry(path string, st fs.FileInfo, above bool, m *mounts) error {
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("%s: no owner to check", path)
	}
	if err := m.check(path, sys.Dev); err != nil {
		return err
	}
	switch {
	case st.Mode()&fs.ModeSymlink != 0:
		return fmt.Errorf("%s is a symbolic link", path)
	case !st.IsDir() && (above || !st.Mode().IsRegular()):
		return fmt.Errorf("%s is not a directory or a regular file", path)
	case !trusted(sys.Uid):
		return fmt.Errorf("%s is owned by uid %d (neither root nor uid %d)", path, sys.Uid, os.Geteuid())
	case above && st.Mode()&fs.ModeSticky != 0:
		return nil
	case st.Mode().Perm()&0o002 != 0:
		return fmt.Errorf("%s is writable by others", path)
	case st.Mode().Perm()&0o020 != 0:
		return fmt.Errorf("%s is writable by its group", path)
	}
	return nil
}

// mounts says, per device, whether a FUSE file system of another user is
// mounted there: its daemon reports whatever owner and mode it likes, so
// an entry there proves nothing (a user can mount one over a directory
// of theirs in /tmp where fuse.conf has user_allow_other).
type mounts struct {
	info []string         // the lines of /proc/self/mountinfo, read on first need
	seen map[uint64]error // device -> its answer
}

func (m *mounts) check(path string, dev uint64) error {
	if err, ok := m.seen[dev]; ok {
		return err
	}
	if m.seen == nil {
		b, err := os.ReadFile("/proc/self/mountinfo")
		if err != nil {
			return fmt.Errorf("check the mounts below %s: %w", path, err)
		}
		m.info = strings.Split(string(b), "\n")
		m.seen = map[uint64]error{}
	}
	err := fuseOwner(m.info, dev, path)
	m.seen[dev] = err
	return err
}

// fuseOwner says why path, on device dev, is not trusted: it is on a
// FUSE mount (a line of mountinfo) whose user_id= is neither root nor
// the caller.
func fuseOwner(mountinfo []string, dev uint64, path string) error {
	id := fmt.Sprintf("%d:%d", unix.Major(dev), unix.Minor(dev))
	for _, line := range mountinfo {
		f := strings.Fields(line)
		sep := slices.Index(f, "-")
		if len(f) < 3 || f[2] != id || sep < 0 || sep+3 >= len(f) {
			continue
		}
		if typ := f[sep+1]; typ != "fuse" && typ != "fuseblk" && !strings.HasPrefix(typ, "fuse.") {
			continue
		}
		for _, o := range strings.Split(f[sep+3], ",") {
			if v, ok := strings.CutPrefix(o, "user_id="); ok {
				if uid, err := strconv.ParseUint(v, 10, 32); err == nil && trusted(uint32(uid)) {
					return nil
				}
				return fmt.Errorf("%s is on a FUSE file system mounted by uid %s", path, v)
			}
		}
		return fmt.Errorf("%s is on a FUSE file system of unknown owner", path)
	}
	return nil
}

// embeddedPython unpacks files into the first private cache directory
// that works: $XDG_CACHE_HOME/gdsfs, ~/.cache/gdsfs,
// $XDG_RUNTIME_DIR/gdsfs, $TMPDIR/gdsfs-EUID, else a new directory made
// under $TMPDIR for this run. Each that fails privateDir is skipped;
// $TMPDIR/gdsfs-run-EUID with a line on warn, since in a shared $TMPDIR
// another user may have made it first. (Not $TMPDIR/gdsfs-EUID: that is
// a daemon's socket directory, 0711 so that other users reach the socket.)
func embeddedPython(warn io.Writer, files fs.FS, version string) (string, error) {
	var roots []string
	if d := os.Getenv("XDG_CACHE_HOME"); filepath.IsAbs(d) {
		roots = append(roots, filepath.Join(d, "gdsfs"))
	}
	if h := os.Getenv("HOME"); filepath.IsAbs(h) {
		roots = append(roots, filepath.Join(h, ".cache", "gdsfs"))
	}
	if d := os.Getenv("XDG_RUNTIME_DIR"); filepath.IsAbs(d) {
		roots = append(roots, filepath.Join(d, "gdsfs"))
	}
	shared := filepath.Join(os.TempDir(), fmt.Sprintf("gdsfs-run-%d", os.Geteuid()))
	var errs []error
	for _, root := range append(roots, shared) {
		dir, err := unpackPython(files, root, version)
		if err == nil {
			return dir, nil
		}
		if root == shared {
			fmt.Fprintf(warn, "gdsfs run: not unpacking the Python package into %v\n", err)
		}
		errs = append(errs, err)
	}
	root, err := os.MkdirTemp("", fmt.Sprintf("gdsfs-run-%d-", os.Geteuid()))
	if err == nil {
		var dir string
		if dir, err = unpackPython(files, root, version); err == nil {
			return dir, nil
		}
	}
	return "", fmt.Errorf("unpack the Python package: %w", errors.Join(append(errs, err)...))
}

// trustedLink refuses root where it is a symbolic link another user made:
// made by someone else in a shared directory, it could send the files
// anywhere the caller may write. A root that does not exist passes.
func trustedLink(root string) error {
	link, err := os.Lstat(root)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if link.Mode()&fs.ModeSymlink != 0 {
		if sys, ok := link.Sys().(*syscall.Stat_t); !ok || !trusted(sys.Uid) {
			return fmt.Errorf("%s: a symbolic link another user made", root)
		}
	}
	return nil
}

// privateDir makes root (0700) unless it exists, and checks that it is
// the caller's alone: owned by the caller, no access for group or
// others, every directory above it trusted (trustedAncestors). It
// returns root's real path.
func privateDir(root string) (string, error) {
	// A link is judged before anything follows it (with
	// fs.protected_symlinks, following another user's link in a sticky
	// directory fails, and the error would not say why), and again once
	// the directory exists.
	if err := trustedLink(root); err != nil {
		return "", err
	}
	if err := os.MkdirAll(root, 0o700); err != nil {
		return "", err
	}
	if err := trustedLink(root); err != nil {
		return "", err
	}
	real, err := filepath.EvalSymlinks(root)
	if err != nil {
		return "", err
	}
	st, err := os.Lstat(real)
	if err != nil {
		return "", err
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	switch {
	case !ok || !st.IsDir():
		return "", fmt.Errorf("%s: not a directory", real)
	case int(sys.Uid) != os.Geteuid():
		return "", fmt.Errorf("%s: owned by uid %d, not uid %d", real, sys.Uid, os.Geteuid())
	case st.Mode().Perm()&0o077 != 0:
		return "", fmt.Errorf("%s: mode %04o, not private to its owner (0700)", real, st.Mode().Perm())
	}
	m := &mounts{}
	if err := trustedAncestors(real, m); err != nil {
		return "", fmt.Errorf("%s: %w", real, err)
	}
	if err := m.check(real, sys.Dev); err != nil {
		return "", err
	}
	return real, nil
}

// unpackPython writes files into root/python-VERSION-HASH (HASH of the
// content, so a "dev" build never reuses another's files) unless it is
// there already, and returns that directory; root must pass privateDir,
// so nobody but the caller and root can have written there. The files
// are written beside and renamed into place, so a concurrent start sees
// all of them or none.
func unpackPython(files fs.FS, root, version string) (string, error) {
	sum, err := contentHash(files)
	if err != nil {
		return "", err
	}
	if root, err = privateDir(root); err != nil {
		return "", err
	}
	dir := filepath.Join(root, fmt.Sprintf("python-%s-%s", sanitize(version), sum))
	if hasPackage(dir) {
		return dir, nil
	}
	tmp, err := os.MkdirTemp(root, ".unpack-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	err = fs.WalkDir(files, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		dst := filepath.Join(tmp, filepath.FromSlash(p))
		if d.IsDir() {
			return os.MkdirAll(dst, 0o755)
		}
		b, err := fs.ReadFile(files, p)
		if err != nil {
			return err
		}
		return os.WriteFile(dst, b, 0o644)
	})
	if err != nil {
		return "", fmt.Errorf("into %s: %w", tmp, err)
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, dir); err != nil && !hasPackage(dir) {
		return "", fmt.Errorf("into %s: %w", dir, err)
	}
	return dir, nil
}

func contentHash(files fs.FS) (string, error) {
	h := sha256.New()
	err := fs.WalkDir(files, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(files, p)
		if err != nil {
			return err
		}
		fmt.Fprintf(h, "%s\x00%d\x00", p, len(b))
		h.Write(b)
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("hash the embedded Python package: %w", err)
	}
	return hex.EncodeToString(h.Sum(nil))[:12], nil
}

func sanitize(v string) string {
	return strings.Map(func(r rune) rune {
		if r == '/' || r == os.PathSeparator || r < ' ' {
			return '_'
		}
		return r
	}, v)
}
