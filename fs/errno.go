package fs

import (
	"context"
	"errors"
	"io/fs"
	"sync"
	"syscall"

	"go.uber.org/zap"

	"github.com/gdsfs/gdsfs/internal/access"
)

// errnoLogger logs each distinct unexpected error text once.
type errnoLogger struct {
	log  *zap.Logger
	mu   sync.Mutex
	seen map[string]bool // guarded by mu
}

// toErrno is the one place errors become kernel errnos: context.Canceled is
// EINTR, an errno anywhere in the chain is itself, not-found ENOENT,
// permission EACCES, a file that is not regular where one must be EINVAL,
// and anything else is logged once and becomes EIO.
func (l *errnoLogger) toErrno(err error) syscall.Errno {
	var errno syscall.Errno
	switch {
	case err == nil:
		return 0
	case errors.Is(err, context.Canceled):
		return syscall.EINTR
	case errors.As(err, &errno):
		return errno
	case errors.Is(err, fs.ErrNotExist):
		return syscall.ENOENT
	case errors.Is(err, fs.ErrPermission):
		return syscall.EACCES
	case errors.Is(err, access.ErrNotRegular):
		return syscall.EINVAL
	}
	l.mu.Lock()
	first := !l.seen[err.Error()]
	if first {
		if l.seen == nil {
			l.seen = map[string]bool{}
		}
		l.seen[err.Error()] = true
	}
	l.mu.Unlock()
	if first {
		l.log.Error("unexpected error, answering EIO", zap.Error(err))
	}
	return syscall.EIO
}
