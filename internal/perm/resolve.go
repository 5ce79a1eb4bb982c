package perm

import (
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
)

// maxLinks bounds the symbolic links one Resolve follows, as the kernel's
// ELOOP limit does.
const maxLinks = 40

// Resolve walks rel beneath root as the kernel would walk it for cred: it
// needs search permission on every directory it passes through, including
// those a symbolic link leads through; it follows relative links that stay
// beneath root and refuses absolute ones and any that leave root (EXDEV).
// It returns rel with no links left and the attributes of the file it
// names. Checking read permission on that file is the caller's part.
func Resolve(root, rel string, cred Cred) (string, *syscall.Stat_t, error) {
	var done []string
	todo := strings.Split(rel, "/")
	links := 0
	for len(todo) > 0 {
		c := todo[0]
		todo = todo[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			if len(done) == 0 {
				return "", nil, fmt.Errorf("%s: leaves the mount: %w", rel, syscall.EXDEV)
			}
			done = done[:len(done)-1]
			continue
		}
		dir := filepath.Join(root, filepath.Join(done...))
		var dst syscall.Stat_t
		if err := syscall.Stat(dir, &dst); err != nil {
			return "", nil, fmt.Errorf("%s: %w", rel, err)
		}
		if dst.Mode&syscall.S_IFMT != syscall.S_IFDIR {
			return "", nil, fmt.Errorf("%s: %s is not a directory: %w", rel, filepath.Join(done...), syscall.ENOTDIR)
		}
		if !CanSearch(&dst, cred) {
			return "", nil, fmt.Errorf("%s: uid %d may not search %q: %w", rel, cred.UID, "/"+filepath.Join(done...), syscall.EACCES)
		}
		p := filepath.Join(dir, c)
		var st syscall.Stat_t
		if err := syscall.Lstat(p, &st); err != nil {
			return "", nil, fmt.Errorf("%s: %w", rel, err)
		}
		if st.Mode&syscall.S_IFMT == syscall.S_IFLNK {
			if links++; links > maxLinks {
				return "", nil, fmt.Errorf("%s: %w", rel, syscall.ELOOP)
			}
			target, err := readlink(p)
			if err != nil {
				return "", nil, fmt.Errorf("%s: %w", rel, err)
			}
			if filepath.IsAbs(target) {
				return "", nil, fmt.Errorf("%s: link %s is absolute: %w", rel, c, syscall.EXDEV)
			}
			todo = append(strings.Split(target, "/"), todo...)
			continue
		}
		done = append(done, c)
		if len(todo) == 0 {
			return filepath.Join(done...), &st, nil
		}
	}
	if len(done) == 0 {
		return "", nil, fmt.Errorf("%q names no file: %w", rel, syscall.EINVAL)
	}
	// The path ended in "." or "..": it names a directory.
	return filepath.Join(done...), nil, fmt.Errorf("%s: a directory: %w", rel, syscall.EISDIR)
}

func readlink(p string) (string, error) {
	buf := make([]byte, 4096)
	n, err := syscall.Readlink(p, buf)
	if err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}
