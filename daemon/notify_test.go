package daemon

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

func TestSdNotify(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	if err := sdNotify("READY=1"); err != nil {
		t.Fatalf("without NOTIFY_SOCKET: %v, want nothing done", err)
	}
	for _, abstract := range []bool{false, true} {
		name := filepath.Join(t.TempDir(), "notify")
		env := name
		if abstract {
			name = fmt.Sprintf("\x00gdsfs-test-%d", os.Getpid())
			env = "@" + name[1:]
		}
		l, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: name, Net: "unixgram"})
		if err != nil {
			t.Fatal(err)
		}
		t.Setenv("NOTIFY_SOCKET", env)
		if err := sdNotify("READY=1"); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 256)
		n, err := l.Read(buf)
		l.Close()
		if err != nil {
			t.Fatal(err)
		}
		if want := fmt.Sprintf("READY=1\nMAINPID=%d", os.Getpid()); string(buf[:n]) != want {
			t.Fatalf("abstract %v: got %q, want %q", abstract, buf[:n], want)
		}
	}
}

// TestSdBarrier: the barrier returns once the manager closed the
// descriptor it got, not before.
func TestSdBarrier(t *testing.T) {
	name := filepath.Join(t.TempDir(), "notify")
	l, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: name, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	t.Setenv("NOTIFY_SOCKET", name)
	done := make(chan error, 1)
	go func() { done <- sdBarrier() }()
	buf, oob := make([]byte, 256), make([]byte, unix.CmsgSpace(4))
	n, oobn, _, _, err := l.ReadMsgUnix(buf, oob)
	if err != nil {
		t.Fatal(err)
	}
	if string(buf[:n]) != "BARRIER=1" {
		t.Fatalf("barrier sent %q", buf[:n])
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		t.Fatalf("barrier's descriptor: %v, %d messages", err, len(msgs))
	}
	fds, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(fds) != 1 {
		t.Fatalf("barrier's descriptor: %v %v", fds, err)
	}
	select {
	case err := <-done:
		t.Fatalf("the barrier returned (%v) before the manager closed its descriptor", err)
	default:
	}
	unix.Close(fds[0])
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
