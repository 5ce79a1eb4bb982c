package daemon

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
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
