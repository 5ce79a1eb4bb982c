package fs

import (
	"context"
	"syscall"
	"testing"

	"github.com/hanwen/go-fuse/v2/fuse"
	"go.uber.org/zap"

	"github.com/gdsfs/gdsfs/internal/access"
)

// TestControlOpen: who may open a control file, and how. The kernel
// already keeps other users off a mount without allow_other; the daemon
// refuses them a writable control all the same, so the integration tests
// cannot reach this check: the callers here are made up.
func TestControlOpen(t *testing.T) {
	write := Control{Name: "prefetch", Write: func(access.Cred, string) error { return nil }}
	read := Control{Name: "stats", Read: func(access.Cred) []byte { return []byte("x") }}
	for _, tc := range []struct {
		name       string
		daemon     uint32 // the daemon's uid
		allowOther bool
		caller     uint32
		ctl        Control
		flags      uint32
		want       syscall.Errno
	}{
		{"another uid writes, no allow_other", 0, false, 65534, write, syscall.O_WRONLY, syscall.EACCES},
		{"another uid writes, allow_other", 0, true, 65534, write, syscall.O_WRONLY, 0},
		{"root writes, no allow_other", 0, false, 0, write, syscall.O_WRONLY, 0},
		{"the daemon's owner writes", 1000, false, 1000, write, syscall.O_WRONLY | syscall.O_APPEND, 0},
		{"another uid writes to a non-root daemon, allow_other", 1000, true, 65534, write, syscall.O_WRONLY, syscall.EACCES},
		{"another uid reads, no allow_other", 0, false, 65534, read, syscall.O_RDONLY, 0},
		{"a writable control opened for reading", 0, true, 0, write, syscall.O_RDONLY, syscall.EACCES},
		{"a readable control opened for writing", 0, true, 0, read, syscall.O_WRONLY, syscall.EACCES},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &Server{uid: tc.daemon, opts: Options{AllowOther: tc.allowOther}, log: zap.NewNop()}
			c := &controlFile{srv: s, ctl: tc.ctl}
			ctx := fuse.NewContext(context.Background(), &fuse.Caller{Owner: fuse.Owner{Uid: tc.caller, Gid: tc.caller}})
			fh, _, errno := c.Open(ctx, tc.flags)
			if errno != tc.want {
				t.Fatalf("open: %v, want %v", errno, tc.want)
			}
			if tc.want == 0 && fh == nil {
				t.Fatal("opened without a handle")
			}
		})
	}
}
