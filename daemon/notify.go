package daemon

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"

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
	conn, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: addr, Net: "unixgram"})
	if err != nil {
		return fmt.Errorf("NOTIFY_SOCKET %s: %w", name, err)
	}
	defer conn.Close()
	return handover.WithFDs(files, func(fds []int) error {
		var oob []byte
		if len(fds) > 0 {
			oob = unix.UnixRights(fds...)
		}
		if _, _, err := conn.WriteMsgUnix([]byte(state), oob, nil); err != nil {
			return fmt.Errorf("NOTIFY_SOCKET %s: %w", name, err)
		}
		return nil
	})
}

// sdBarrier returns once the service manager has handled every
// notification sent before (sd_notify_barrier(3)): it sends BARRIER=1
// with a pipe's write end and waits for the manager to close it. Without
// $NOTIFY_SOCKET it returns at once.
func sdBarrier() error {
	if os.Getenv("NOTIFY_SOCKET") == "" {
		return nil
	}
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	defer r.Close()
	err = sdNotifyFiles("BARRIER=1", []*os.File{w})
	w.Close()
	if err != nil {
		return err
	}
	if _, err := io.Copy(io.Discard, r); err != nil && !errors.Is(err, os.ErrClosed) {
		return err
	}
	return nil
}
