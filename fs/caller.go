package fs

import (
	"context"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fuse"
	"go.uber.org/zap"

	"github.com/gdsfs/gdsfs/internal/access"
)

// caller returns the credentials of the request in ctx: uid and gid from
// the FUSE request header, supplementary groups and capabilities of the
// calling thread (a uid-0 caller without CAP_DAC_OVERRIDE has no more
// rights than its ids give). A thread the daemon cannot see (it exited, or
// lives in another PID namespace) keeps no supplementary group and no
// capability: fewer rights, never more.
func (s *Server) caller(ctx context.Context) (access.Cred, bool) {
	c, ok := fuse.FromContext(ctx)
	if !ok {
		return access.Cred{}, false
	}
	if s.uid != 0 {
		// A daemon that is not root serves only the user who mounted (no
		// allow_other) and cannot take another identity.
		return access.Daemon(), c.Uid == s.uid
	}
	cred, err := access.FromPID(int32(c.Pid), c.Uid, c.Gid)
	if err != nil {
		s.log.Debug("caller without supplementary groups", zap.Error(err))
	}
	return cred, true
}

// as runs fn with the credentials of the request in ctx, so the kernel
// decides every permission fn needs, and maps its error.
func (s *Server) as(ctx context.Context, fn func() error) syscall.Errno {
	c, ok := s.caller(ctx)
	if !ok {
		return syscall.EACCES
	}
	return s.errs.toErrno(c.Do(fn))
}

// changed tells the Stager that the mount changed rel.
func (s *Server) changed(rel string) {
	if s.stager != nil && rel != "" {
		s.stager.Changed(rel)
	}
}
