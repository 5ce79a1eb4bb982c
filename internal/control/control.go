// Package control opens a gdsfs mount's .gdsfs control files for the
// programs that write them (the bench, warmup). It must never open them
// through os.OpenFile: see OpenWriter.
package control

import (
	"os"

	"golang.org/x/sys/unix"
)

// OpenWriter opens the control file at path for writing, one line per
// write, in blocking mode, so that a line the daemon refuses (EAGAIN: the
// prefetch queue is full) comes back as that write's error.
//
// os.OpenFile would hang there: a FUSE file takes epoll_ctl (the kernel's
// fuse_file_poll answers for a daemon that implements no poll), so Go puts
// the descriptor in non-blocking mode under its poller, reads EAGAIN as
// "not writable yet" and parks the write until a readiness event that a
// FUSE file without poll never sends. os.NewFile leaves a blocking
// descriptor out of the poller.
func OpenWriter(path string) (*os.File, error) {
	fd, err := unix.Open(path, unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	return os.NewFile(uintptr(fd), path), nil
}
