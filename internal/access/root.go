package access

import (
	"errors"
	"fmt"
	"os"
	"path"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// Root is SOURCE, held open: every path is resolved beneath it.
//
// SOURCE is the directory opened, not its path: as with a bind mount, a
// SOURCE renamed away is still served where it went, and a SOURCE removed
// is served as the removed (empty) directory it now is, even if another
// directory is made at its path; serving that one takes a new Root (a
// remount).
type Root struct {
	path string

	mu sync.RWMutex
	f  *os.File // guarded by mu; nil once closed
}

// OpenRoot opens the directory path.
func OpenRoot(p string) (*Root, error) {
	fd, err := unix.Open(p, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: p, Err: err}
	}
	return &Root{path: p, f: os.NewFile(uintptr(fd), p)}, nil
}

// Path is the path SOURCE was opened by.
func (r *Root) Path() string { return r.path }

// Close closes the directory descriptor; later resolutions fail with
// os.ErrClosed.
func (r *Root) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.f == nil {
		return os.ErrClosed
	}
	err := r.f.Close()
	r.f = nil
	return err
}

// At runs fn with SOURCE's descriptor, which fn must not keep.
func (r *Root) At(fn func(dirfd int) error) error {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if r.f == nil {
		return os.ErrClosed
	}
	return fn(int(r.f.Fd()))
}

// Clean turns a path under SOURCE into its clean relative form ("." for
// SOURCE itself). It refuses paths that climb above SOURCE lexically.
func Clean(rel string) (string, error) {
	if strings.IndexByte(rel, 0) >= 0 {
		return "", fmt.Errorf("%q: a NUL byte in a path: %w", rel, syscall.EINVAL)
	}
	c := path.Clean("/" + rel)
	if c == "/" {
		return ".", nil
	}
	return c[1:], nil
}

// Resolve flags. Beneath follows symbolic links that stay beneath SOURCE
// (as a reader of SOURCE would, minus absolute ones); NoSymlinks refuses
// any link on the way (ELOOP), for paths the kernel already walked through
// the mount, where a link can only mean the tree changed underneath.
const (
	Beneath    = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS
	NoSymlinks = Beneath | unix.RESOLVE_NO_SYMLINKS
)

// Open opens rel beneath SOURCE with flags (O_CLOEXEC is added) and
// resolve (Beneath or NoSymlinks), with the daemon's own credentials.
func (r *Root) Open(rel string, flags int, mode uint32, resolve uint64) (*os.File, error) {
	rel, err := Clean(rel)
	if err != nil {
		return nil, err
	}
	how := &unix.OpenHow{Flags: uint64(flags | unix.O_CLOEXEC), Mode: uint64(mode), Resolve: resolve}
	var fd int
	err = r.At(func(dirfd int) error {
		var e error
		fd, e = openBeneath(dirfd, rel, how)
		return e
	})
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: rel, Err: err}
	}
	return os.NewFile(uintptr(fd), rel), nil
}

// OpenAs is Open run with c's credentials: the kernel checks c's right to
// every directory on the way and to the file itself.
func (r *Root) OpenAs(c Cred, rel string, flags int, mode uint32, resolve uint64) (*os.File, error) {
	var f *os.File
	err := c.Do(func() error {
		var e error
		f, e = r.Open(rel, flags, mode, resolve)
		return e
	})
	return f, err
}

// ErrNotRegular is wrapped when a file to be read whole is a directory,
// FIFO, socket or device.
var ErrNotRegular = errors.New("not a regular file")

// OpenRegular opens rel for reading as c without opening anything but a
// regular file: it resolves rel to an O_PATH descriptor (no open of the
// file itself, so a FIFO cannot block and a device node sees no open),
// refuses anything but a regular file with ErrNotRegular, and only then
// opens that very inode for reading through /proc/self/fd, as c (the
// kernel checks c's read right on it; the path walk was checked by the
// O_PATH resolution, also as c). extra is or-ed into the flags (O_NOATIME,
// O_DIRECT). It returns the file's attributes as read from the descriptor.
func (r *Root) OpenRegular(c Cred, rel string, extra int, resolve uint64) (*os.File, *unix.Stat_t, error) {
	var f *os.File
	var st unix.Stat_t
	err := c.Do(func() error {
		p, err := r.Open(rel, unix.O_PATH, 0, resolve)
		if err != nil {
			return err
		}
		defer p.Close()
		if err := unix.Fstat(int(p.Fd()), &st); err != nil {
			return &os.PathError{Op: "stat", Path: p.Name(), Err: err}
		}
		if st.Mode&unix.S_IFMT != unix.S_IFREG {
			return &os.PathError{Op: "open", Path: p.Name(), Err: fmt.Errorf("%w (%s)", ErrNotRegular, kind(st.Mode))}
		}
		proc := fmt.Sprintf("/proc/self/fd/%d", p.Fd())
		flags := unix.O_RDONLY | unix.O_NOCTTY | unix.O_CLOEXEC | extra
		fd, err := unix.Open(proc, flags, 0)
		if err == unix.EPERM && extra&unix.O_NOATIME != 0 {
			// O_NOATIME needs ownership of the file (or CAP_FOWNER).
			fd, err = unix.Open(proc, flags&^unix.O_NOATIME, 0)
		}
		if err != nil {
			return &os.PathError{Op: "open", Path: p.Name(), Err: err}
		}
		f = os.NewFile(uintptr(fd), p.Name())
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	return f, &st, nil
}

func kind(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFDIR:
		return "a directory"
	case unix.S_IFIFO:
		return "a FIFO"
	case unix.S_IFSOCK:
		return "a socket"
	case unix.S_IFCHR:
		return "a character device"
	case unix.S_IFBLK:
		return "a block device"
	case unix.S_IFLNK:
		return "a symbolic link"
	}
	return "not a regular file"
}

// pathMax is the longest path one system call takes (PATH_MAX less the
// terminating NUL).
const pathMax = unix.PathMax - 1

// openBeneath opens rel (clean, relative) beneath dirfd with how. A path
// longer than one system call takes is resolved a piece at a time, each
// piece at most pathMax bytes and ending before a '/', opened as an O_PATH
// directory beneath the one before it with the same resolve flags: a
// symbolic link in a later piece may not climb above that piece's first
// directory (EXDEV), where a single call would let it climb as far as
// dirfd.
func openBeneath(dirfd int, rel string, how *unix.OpenHow) (int, error) {
	if len(rel) <= pathMax {
		return openat2(dirfd, rel, how)
	}
	dir := &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: how.Resolve}
	cur := dirfd
	for len(rel) > pathMax {
		cut := strings.LastIndexByte(rel[:pathMax+1], '/')
		if cut <= 0 {
			return -1, unix.ENAMETOOLONG // a component longer than pathMax: no file system has one
		}
		fd, err := openat2(cur, rel[:cut], dir)
		if cur != dirfd {
			unix.Close(cur)
		}
		if err != nil {
			return -1, err
		}
		cur, rel = fd, rel[cut+1:]
	}
	fd, err := openat2(cur, rel, how)
	if cur != dirfd {
		unix.Close(cur)
	}
	return fd, err
}

// openat2 retries EINTR and EAGAIN (the kernel answers EAGAIN to
// RESOLVE_* lookups racing with a rename elsewhere).
func openat2(dirfd int, rel string, how *unix.OpenHow) (int, error) {
	for i := 0; ; i++ {
		fd, err := unix.Openat2(dirfd, rel, how)
		if (err == unix.EINTR || err == unix.EAGAIN) && i < 16 {
			continue
		}
		return fd, err
	}
}
