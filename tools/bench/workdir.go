package bench

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// openWorkDir makes dir safe to work in for whoever runs the bench (root,
// often): dir and every directory above it are owned by root or the
// caller, and none is writable by group or other, except sticky ones
// above dir (a /tmp). Missing directories are made 0700. Symbolic links
// on the way are followed only where root or the caller owns them. Inside
// such a directory no other user can put a file or a link, so the bench's
// files there are its own.
func openWorkDir(flag, dir string) error {
	if dir == "" {
		return fmt.Errorf("%s: no work directory", flag)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return fmt.Errorf("%s %s: %w", flag, dir, err)
	}
	if err := walkWorkDir(abs); err != nil {
		return fmt.Errorf("%s %s: %w (a work directory must be owned by root or you and writable by no one else, nor may any directory above it be, unless sticky)", flag, dir, err)
	}
	return nil
}

func walkWorkDir(abs string) error {
	uid := uint32(os.Geteuid())
	rest := strings.Split(strings.Trim(abs, "/"), "/")
	cur := "/"
	if err := checkDir(cur, uid, len(rest) == 0 || rest[0] == ""); err != nil {
		return err
	}
	for hops := 0; len(rest) > 0; {
		name := rest[0]
		rest = rest[1:]
		switch name {
		case "", ".":
			continue
		case "..":
			cur = filepath.Dir(cur)
			continue
		}
		next := filepath.Join(cur, name)
		st, err := os.Lstat(next)
		if errors.Is(err, fs.ErrNotExist) {
			if err = os.Mkdir(next, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
				return err
			}
			st, err = os.Lstat(next)
		}
		if err != nil {
			return err
		}
		if st.Mode()&fs.ModeSymlink != 0 {
			if o := owner(st); o != 0 && o != uid {
				return fmt.Errorf("%s is a symbolic link of uid %d", next, o)
			}
			if hops++; hops > 40 {
				return fmt.Errorf("%s: too many symbolic links", next)
			}
			target, err := os.Readlink(next)
			if err != nil {
				return err
			}
			if filepath.IsAbs(target) {
				cur = "/"
			}
			rest = append(strings.Split(target, "/"), rest...)
			continue
		}
		if err := checkDir(next, uid, !hasDir(rest)); err != nil {
			return err
		}
		cur = next
	}
	return nil
}

// hasDir reports whether rest names a directory still to walk.
func hasDir(rest []string) bool {
	for _, n := range rest {
		if n != "" && n != "." {
			return true
		}
	}
	return false
}

// checkDir refuses path unless it is a directory owned by root or uid,
// writable by no one else; last (the work directory itself) may not be
// sticky either.
func checkDir(path string, uid uint32, last bool) error {
	st, err := os.Lstat(path)
	if err != nil {
		return err
	}
	if !st.IsDir() {
		return fmt.Errorf("%s is not a directory", path)
	}
	if o := owner(st); o != 0 && o != uid {
		return fmt.Errorf("%s is owned by uid %d", path, o)
	}
	if st.Mode().Perm()&0o022 != 0 && (last || st.Mode()&fs.ModeSticky == 0) {
		return fmt.Errorf("%s is writable by group or other (mode %04o)", path, st.Mode().Perm())
	}
	return nil
}

func owner(st fs.FileInfo) uint32 {
	if s, ok := st.Sys().(*syscall.Stat_t); ok {
		return s.Uid
	}
	return 0
}

// createFile makes path anew for writing (O_EXCL, not through a link):
// what was there is removed first.
func createFile(path string, perm fs.FileMode) (*os.File, error) {
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	return os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, perm)
}

// writeNew is os.WriteFile through createFile.
func writeNew(path string, body []byte, perm fs.FileMode) error {
	f, err := createFile(path, perm)
	if err != nil {
		return err
	}
	_, err = f.Write(body)
	return joinClose(err, f)
}
