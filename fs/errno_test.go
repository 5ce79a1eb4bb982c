package fs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

func TestToErrno(t *testing.T) {
	core, logs := observer.New(zap.ErrorLevel)
	l := &errnoLogger{log: zap.New(core)}
	for _, tc := range []struct {
		err  error
		want syscall.Errno
	}{
		{nil, 0},
		{fmt.Errorf("stage x: %w", context.Canceled), syscall.EINTR},
		{fmt.Errorf("stage x: %w", os.ErrNotExist), syscall.ENOENT},
		{&os.PathError{Op: "open", Path: "x", Err: syscall.ENOENT}, syscall.ENOENT},
		{fmt.Errorf("evict: %w", syscall.EBUSY), syscall.EBUSY},
		{os.ErrPermission, syscall.EACCES},
		{errors.New("weird"), syscall.EIO},
		{errors.New("weird"), syscall.EIO},
	} {
		if got := l.toErrno(tc.err); got != tc.want {
			t.Errorf("toErrno(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
	if logs.Len() != 1 {
		t.Errorf("unexpected errors logged %d times, want once", logs.Len())
	}
}
