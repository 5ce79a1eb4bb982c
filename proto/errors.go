package proto

import (
	"errors"
	"fmt"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// The errnos the daemon answers, with what each means on the lease socket
// (PROTOCOL.md lists them). Clients map any other name to EIO.
const (
	EACCES       = syscall.EACCES       // the peer may not read the file (the kernel said so)
	EAGAIN       = syscall.EAGAIN       // the file was replaced while it was being leased; try again
	EBUSY        = syscall.EBUSY        // changed or evicted again and again while staging
	EDQUOT       = syscall.EDQUOT       // a per-uid limit (leases, held bytes) is reached
	EFBIG        = syscall.EFBIG        // the file is larger than the capacity: it can never be staged
	EINVAL       = syscall.EINVAL       // a malformed request, or a path that is not a regular file
	EIO          = syscall.EIO          // staging failed (the message says why)
	EMFILE       = syscall.EMFILE       // too many connections (ipc.max_connections, per uid), or descriptors dropped (MSG_CTRUNC)
	ENAMETOOLONG = syscall.ENAMETOOLONG // a path longer than MaxPath
	ENOENT       = syscall.ENOENT       // no such file
	ENODATA      = syscall.ENODATA      // the request asked for a resident file and this one is not
	ENOSPC       = syscall.ENOSPC       // no room within ipc.acquire_timeout: the capacity is held by leases
	E2BIG        = syscall.E2BIG        // a request line longer than ipc.max_request (the connection is closed)
	ESTALE       = syscall.ESTALE       // the generation asked for is no longer current, or a lease of another epoch
	ETIMEDOUT    = syscall.ETIMEDOUT    // staging did not finish within ipc.acquire_timeout
	EPROTO       = syscall.EPROTO       // (client side) an answer that breaks this protocol
	EILSEQ       = syscall.EILSEQ       // (client side) a path that is not UTF-8, refused before it is sent
)

// Error is a failure carried by an answer (or found by a client in one):
// errors.Is(err, syscall.EACCES) works on it.
type Error struct {
	Code syscall.Errno
	Msg  string
}

func (e *Error) Error() string { return e.Msg }

// Unwrap makes the errno visible to errors.Is.
func (e *Error) Unwrap() error { return e.Code }

// Errno is the errno's name ("EACCES").
func (e *Error) Errno() string { return ErrnoName(e.Code) }

// Errorf makes an *Error.
func Errorf(code syscall.Errno, format string, a ...any) *Error {
	return &Error{Code: code, Msg: fmt.Sprintf(format, a...)}
}

// ErrnoName is e's name ("EACCES"); EIO for 0 or an errno with no name.
func ErrnoName(e syscall.Errno) string {
	if n := unix.ErrnoName(e); n != "" {
		return n
	}
	return "EIO"
}

var byName struct {
	once sync.Once
	m    map[string]syscall.Errno
}

// ParseErrno maps a name back to its errno; EIO when unknown.
func ParseErrno(name string) syscall.Errno {
	byName.once.Do(func() {
		byName.m = map[string]syscall.Errno{}
		for e := syscall.Errno(1); e < 4096; e++ {
			if n := unix.ErrnoName(e); n != "" {
				if _, dup := byName.m[n]; !dup {
					byName.m[n] = e
				}
			}
		}
	})
	if e, ok := byName.m[name]; ok {
		return e
	}
	return syscall.EIO
}

// ErrnoOf is the errno err carries, or EIO.
func ErrnoOf(err error) syscall.Errno {
	var e syscall.Errno
	if errors.As(err, &e) && e != 0 {
		return e
	}
	return syscall.EIO
}
