package fs

import (
	"bytes"
	"context"
	"errors"
	"strconv"
	"strings"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// Extended attributes are read and written through /proc/self/fd/N of
// the node's O_PATH descriptor: the kernel acts on that very inode (a
// symbolic link opened O_PATH|O_NOFOLLOW included; the jump to it is not
// followed further), as the caller.
//
// Setting an attribute outside user.* and system.posix_acl_* needs
// capabilities (CAP_SYS_ADMIN for trusted.*, CAP_SETFCAP for
// security.capability) that the daemon's thread keeps while it acts as the
// caller (changing fsuid drops only the file-system capabilities), so
// callers other than root may not set, remove or read those names: they
// get what they would get natively without the capability.

const xattrPrefix = "user.gdsfs."

func procPath(fd int) string { return "/proc/self/fd/" + strconv.Itoa(fd) }

// privilegedName reports whether a caller needs a capability beyond the
// file-system ones to set name.
func privilegedName(name string) bool {
	return !strings.HasPrefix(name, "user.") && name != aclAccess && name != aclDefault
}

func isRoot(ctx context.Context) bool {
	c, ok := fuse.FromContext(ctx)
	return ok && c.Uid == 0
}

var _ = (gofs.NodeGetxattrer)((*node)(nil))

// Getxattr answers user.gdsfs.state and user.gdsfs.path for regular files
// and passes every other name to the backing file. user.gdsfs.* describes
// the file now at the node's path, so it is an error (ESTALE, or ENOENT)
// where that is no longer the node's file: asked through a descriptor
// opened before SOURCE's file was replaced, it does not describe the new
// file (the autoloader's check that a file object is the file it leased).
func (n *node) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	if name, ok := strings.CutPrefix(attr, xattrPrefix); ok && isRegular(n.StableAttr().Mode) {
		if errno := n.self(ctx, func(int, *syscall.Stat_t) error { return nil }); errno != 0 {
			return 0, errno
		}
		return answer(n.gdsfsAttr(name), dest)
	}
	if strings.HasPrefix(attr, "trusted.") && !isRoot(ctx) {
		return 0, syscall.ENODATA
	}
	var size int
	get := func() error {
		return n.selfAs(func(fd int, _ *syscall.Stat_t) (err error) {
			size, err = unix.Getxattr(procPath(fd), attr, dest)
			return err
		})
	}
	if attr == aclAccess || attr == aclDefault {
		// Reading an ACL needs no right on the file, only on the path to
		// it, which the kernel walked as the caller. The kernel asks for
		// the ACL of every inode it checks a permission on (the root's on
		// every path walk), so it is answered without taking the caller's
		// identity.
		errno := n.srv.errs.toErrno(get())
		return uint32(max(size, 0)), errno
	}
	if strings.HasPrefix(attr, "security.") && n.cachedMeta() {
		return n.securityXattr(ctx, attr, get, &size)
	}
	errno := n.srv.as(ctx, get)
	if errno == syscall.ENODATA {
		errno = absentXattr(attr)
	}
	return uint32(max(size, 0)), errno
}

// absentXattr is the error for attr where the file does not have it:
// ENODATA, but EOPNOTSUPP for security.selinux (securityXattr says why).
func absentXattr(attr string) syscall.Errno {
	if attr == selinuxXattr {
		return syscall.EOPNOTSUPP
	}
	return syscall.ENODATA
}

// securityXattr answers a security.* name that the node's file is known
// not to have without asking SOURCE. Reading a security.* name needs no
// right on the file, only on the path to it, which the kernel walked as
// the caller. What is known is forgotten when SOURCE reports a change to
// the file's attributes.
//
// security.selinux that the file does not have answers EOPNOTSUPP, not
// ENODATA: `ls -l` asks for it of every file, and stops asking for the
// rest of a device that does not support it. Only a kernel without
// SELinux active sends the name here (where SELinux is active, it
// answers security.selinux itself), so no label is hidden from it; a
// file SOURCE labels still answers its label.
func (n *node) securityXattr(ctx context.Context, attr string, get func() error, size *int) (uint32, syscall.Errno) {
	absentErr := absentXattr(attr)
	n.mu.Lock()
	absent, gen := n.noXattr[attr], n.xattrGen
	n.mu.Unlock()
	if absent {
		return 0, absentErr
	}
	errno := n.srv.as(ctx, get)
	if errno == syscall.ENODATA {
		errno = absentErr
		n.mu.Lock()
		if n.xattrGen == gen {
			if n.noXattr == nil {
				n.noXattr = map[string]bool{}
			}
			n.noXattr[attr] = true
		}
		n.mu.Unlock()
	}
	return uint32(max(*size, 0)), errno
}

// forgetXattrs forgets what securityXattr knew.
func (n *node) forgetXattrs() {
	n.mu.Lock()
	n.noXattr = nil
	n.xattrGen++
	n.mu.Unlock()
}

const (
	selinuxXattr = "security.selinux"
	aclAccess    = "system.posix_acl_access"
	aclDefault   = "system.posix_acl_default"
)

// gdsfsAttr is the value of user.gdsfs.NAME ("" when there is none).
func (n *node) gdsfsAttr(name string) string {
	state, path := "absent", ""
	if n.srv.stager != nil {
		rel, _ := n.rel()
		state, path = n.srv.stager.Attr(rel)
	}
	switch name {
	case "state":
		return state
	case "path":
		return path
	}
	return ""
}

// answer copies v to dest with getxattr's conventions.
func answer(v string, dest []byte) (uint32, syscall.Errno) {
	switch {
	case v == "":
		return 0, syscall.ENODATA
	case len(dest) == 0:
		return uint32(len(v)), 0
	case len(dest) < len(v):
		return uint32(len(v)), syscall.ERANGE
	}
	return uint32(copy(dest, v)), 0
}

var _ = (gofs.NodeListxattrer)((*node)(nil))

// Listxattr lists the backing file's names, and for a regular file the
// user.gdsfs.* names that have a value, so `getfattr -d -m -` shows them.
func (n *node) Listxattr(ctx context.Context, dest []byte) (uint32, syscall.Errno) {
	var list []byte
	errno := n.self(ctx, func(fd int, _ *syscall.Stat_t) (err error) {
		list, err = listxattr(procPath(fd))
		return err
	})
	if errno != 0 {
		return 0, errno
	}
	var out []byte
	root, regular := isRoot(ctx), isRegular(n.StableAttr().Mode)
	for _, name := range bytes.Split(bytes.TrimSuffix(list, []byte{0}), []byte{0}) {
		hidden := !root && bytes.HasPrefix(name, []byte("trusted.")) ||
			regular && bytes.HasPrefix(name, []byte(xattrPrefix)) // shadowed by the daemon's
		if len(name) > 0 && !hidden {
			out = append(append(out, name...), 0)
		}
	}
	if regular {
		for _, name := range []string{"state", "path"} {
			if n.gdsfsAttr(name) != "" {
				out = append(append(out, xattrPrefix+name...), 0)
			}
		}
	}
	switch {
	case len(dest) == 0:
		return uint32(len(out)), 0
	case len(dest) < len(out):
		return uint32(len(out)), syscall.ERANGE
	}
	return uint32(copy(dest, out)), 0
}

// listxattr reads the whole name list of path.
func listxattr(path string) ([]byte, error) {
	for {
		size, err := unix.Listxattr(path, nil)
		if err != nil || size == 0 {
			return nil, err
		}
		buf := make([]byte, size)
		size, err = unix.Listxattr(path, buf)
		if errors.Is(err, syscall.ERANGE) {
			continue // grew meanwhile
		}
		if err != nil {
			return nil, err
		}
		return buf[:size], nil
	}
}

var (
	_ = (gofs.NodeSetxattrer)((*node)(nil))
	_ = (gofs.NodeRemovexattrer)((*node)(nil))
)

func (n *node) Setxattr(ctx context.Context, attr string, data []byte, flags uint32) syscall.Errno {
	if errno := n.mayChangeXattr(ctx, attr); errno != 0 {
		return errno
	}
	return n.self(ctx, func(fd int, _ *syscall.Stat_t) error {
		return unix.Setxattr(procPath(fd), attr, data, int(flags))
	})
}

func (n *node) Removexattr(ctx context.Context, attr string) syscall.Errno {
	if errno := n.mayChangeXattr(ctx, attr); errno != 0 {
		return errno
	}
	return n.self(ctx, func(fd int, _ *syscall.Stat_t) error {
		return unix.Removexattr(procPath(fd), attr)
	})
}

func (n *node) mayChangeXattr(ctx context.Context, attr string) syscall.Errno {
	switch {
	case n.ro():
		return syscall.EROFS
	case strings.HasPrefix(attr, xattrPrefix) && isRegular(n.StableAttr().Mode):
		return syscall.EPERM // the daemon's own, read-only
	case privilegedName(attr) && !isRoot(ctx):
		return syscall.EPERM
	}
	return 0
}
