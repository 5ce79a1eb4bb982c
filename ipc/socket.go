package ipc

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"
)

// socketDirMode is the mode of a socket directory the daemon makes: its
// euid may write it, others may only pass through it to the socket
// (whose name the mount's .gdsfs/socket gives), not list or change it.
const socketDirMode = 0o711

// listen binds path, mode 0666: anyone on the node may connect; what a
// peer may lease is decided per request by opening the file as the peer,
// and clients check that the listener is the mount's owner. The
// directory holding it is made (socketDirMode) if missing, and used only
// if nobody but the daemon's euid or root can change what is in it.
func listen(path string) (*net.UnixListener, error) {
	dir := filepath.Dir(path)
	if err := SocketDir(dir); err != nil {
		return nil, err
	}
	if st, err := os.Lstat(path); err == nil {
		if st.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("%s exists and is not a socket (%s)", path, st.Mode().Type())
		}
		if c, err := net.Dial("unix", path); err == nil {
			c.Close()
			return nil, errors.New("in use by another daemon")
		}
		os.Remove(path) // left by a daemon that died
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, err
	}
	ln.SetUnlinkOnClose(true)
	if err := openToAll(path); err != nil {
		ln.Close()
		return nil, err
	}
	return ln, nil
}

// SocketDir makes dir (socketDirMode, its parents 0755) or checks the
// one there: a real directory, not a symbolic link, owned by the
// daemon's euid or root, that neither group nor others may write.
// Anyone who could write it could put their own socket where clients
// look for the daemon's.
func SocketDir(dir string) error {
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return err
	}
	if err := os.Mkdir(dir, socketDirMode); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	st, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	euid := os.Geteuid()
	sys, _ := st.Sys().(*syscall.Stat_t)
	switch {
	case st.Mode()&os.ModeSymlink != 0:
		return fmt.Errorf("socket directory %s is a symbolic link; remove it or set ipc.socket", dir)
	case !st.IsDir():
		return fmt.Errorf("socket directory %s is not a directory (%s)", dir, st.Mode().Type())
	case sys == nil:
		return fmt.Errorf("socket directory %s: no owner known", dir)
	case sys.Uid != uint32(euid) && sys.Uid != 0:
		return fmt.Errorf("socket directory %s is owned by uid %d, not the daemon's (%d) or root; remove it or set ipc.socket", dir, sys.Uid, euid)
	case st.Mode().Perm()&0o022 != 0:
		return fmt.Errorf("socket directory %s is writable by group or others (mode %04o); remove it or set ipc.socket", dir, st.Mode().Perm())
	}
	return nil
}

// openToAll makes the socket just bound at path mode 0666, acting on the
// file itself (opened O_PATH|O_NOFOLLOW): never on what a symbolic link
// put in its place names.
func openToAll(path string) error {
	fd, err := unix.Open(path, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK || st.Uid != uint32(os.Geteuid()) {
		return fmt.Errorf("%s is not the socket this daemon bound (mode %o, owner %d)", path, st.Mode, st.Uid)
	}
	// chmod of an O_PATH descriptor goes through its /proc link, which
	// names the inode opened, not a path.
	return os.Chmod(fmt.Sprintf("/proc/self/fd/%d", fd), 0o666)
}

// DefaultSocket is /run/gdsfs/<hash of mountpoint>.sock for root (or a
// daemon that owns /run/gdsfs), else in $XDG_RUNTIME_DIR when it is a
// directory of the daemon's euid, else in <temp dir>/gdsfs-<euid>
// (made by listen). It changes nothing on disk.
func DefaultSocket(mountpoint string) string {
	name := fmt.Sprintf("%016x.sock", fnv64(mountpoint))
	euid := os.Geteuid()
	if euid == 0 || ownDir("/run/gdsfs", euid) {
		return filepath.Join("/run/gdsfs", name)
	}
	if x := os.Getenv("XDG_RUNTIME_DIR"); filepath.IsAbs(x) && ownDir(x, euid) {
		return filepath.Join(x, name)
	}
	return filepath.Join(os.TempDir(), fmt.Sprintf("gdsfs-%d", euid), name)
}

// ownDir says whether dir is a directory (not a link) owned by uid.
func ownDir(dir string, uid int) bool {
	st, err := os.Lstat(dir)
	if err != nil || !st.IsDir() {
		return false
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	return ok && sys.Uid == uint32(uid)
}
