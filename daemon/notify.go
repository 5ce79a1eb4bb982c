package daemon

import (
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/daemon/handover"
)

// sdNotify sends state ("READY=1", "STOPPING=1") to the service manager's
// notification socket, $NOTIFY_SOCKET (sd_notify(3)); without one it does
// nothing. An abstract socket is named with a leading '@'.
func sdNotify(state string) error {
	return sdNotifyFiles(fmt.Sprintf("%s\nMAINPID=%d", state, os.Getpid()), nil)
}

// sdNotifyFiles sends state with files attached (FDSTORE=1,
// BARRIER=1); without $NOTIFY_SOCKET it does nothing.
func sdNotifyFiles(state string, files []*os.File) error {
	name := os.Getenv("NOTIFY_SOCKET")
	if name == "" {
		return nil
	}
	addr := name
	if addr[0] == '@' {
		addr = "\x00" + addr[1:]
	}
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("NOTIFY_SOCKET %s: %w", name, err)
	}
	defer unix.Close(fd)
	return handover.WithFDs(files, func(fds []int) error {
		var oob []byte
		if len(fds) > 0 {
			oob = unix.UnixRights(fds...)
		}
		if err := unix.Sendmsg(fd, []byte(state), oob, &unix.SockaddrUnix{Name: addr}, 0); err != nil {
			return fmt.Errorf("NOTIFY_SOCKET %s: %w", name, err)
		}
		return nil
	})
}

// barrierTimeout bounds sdBarrier, as sd_notify_barrier(3) callers
// usually do: a manager that does not know BARRIER=1 never closes the
// descriptor.
const barrierTimeout = 5 * time.Second

// sdBarrier returns once the service manager has handled every
// notification sent before (sd_notify_barrier(3)): it sends BARRIER=1
// with a pipe's write end and waits for the manager to close it, at most
// barrierTimeout. Without $NOTIFY_SOCKET it returns at once.
func sdBarrier() error {
	if os.Getenv("NOTIFY_SOCKET") == "" {
		return nil
	}
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		return err
	}
	defer unix.Close(p[0])
	w := os.NewFile(uintptr(p[1]), "barrier")
	err := sdNotifyFiles("BARRIER=1", []*os.File{w})
	w.Close()
	if err != nil {
		return err
	}
	fds := []unix.PollFd{{Fd: int32(p[0]), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, int(barrierTimeout/time.Millisecond))
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			return err
		case n == 0:
			return fmt.Errorf("the service manager did not answer BARRIER=1 within %s", barrierTimeout)
		}
		return nil // POLLHUP: the manager closed its end
	}
}
