package daemon

import (
	"fmt"
	"net"
	"os"
)

// sdNotify sends state ("READY=1", "STOPPING=1") to the service manager's
// notification socket, $NOTIFY_SOCKET (sd_notify(3)); without one it does
// nothing. An abstract socket is named with a leading '@'.
func sdNotify(state string) error {
	name := os.Getenv("NOTIFY_SOCKET")
	if name == "" {
		return nil
	}
	if name[0] == '@' {
		name = "\x00" + name[1:]
	}
	conn, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: name, Net: "unixgram"})
	if err != nil {
		return fmt.Errorf("NOTIFY_SOCKET %s: %w", os.Getenv("NOTIFY_SOCKET"), err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte(fmt.Sprintf("%s\nMAINPID=%d", state, os.Getpid()))); err != nil {
		return fmt.Errorf("NOTIFY_SOCKET %s: %w", os.Getenv("NOTIFY_SOCKET"), err)
	}
	return nil
}
