package access

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestMain lets a test run this binary as a socket client: with
// GDSFS_ACCESS_TEST_CONNECT set, it connects there and exits at once.
func TestMain(m *testing.M) {
	if p := os.Getenv("GDSFS_ACCESS_TEST_CONNECT"); p != "" {
		c, err := net.Dial("unix", p)
		if err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(2)
		}
		c.Close()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// accepted returns the daemon's end of a connection made by cmd (run to
// its end before the connection is accepted) or by this process (cmd nil).
func accepted(t *testing.T, cmd *exec.Cmd) int {
	t.Helper()
	p := filepath.Join(t.TempDir(), "s")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: p, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	if cmd != nil {
		cmd.Env = append(os.Environ(), "GDSFS_ACCESS_TEST_CONNECT="+p)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%v: %v\n%s", cmd.Args, err, out)
		}
	} else {
		c, err := net.Dial("unix", p)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
	}
	c, err := ln.AcceptUnix()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	f, err := c.File()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return int(f.Fd())
}

// TestPeerCapabilities: a live peer with the daemon's ids has its
// capabilities; a peer that has exited (its pid free to be reused) has
// none, whatever its uid.
func TestPeerCapabilities(t *testing.T) {
	needRoot(t)
	c, err := Peer(accepted(t, nil))
	if err != nil || c.UID != 0 || c.Caps != Daemon().Caps {
		t.Fatalf("this process as a peer: %v %v, want uid 0 with caps %#x", c, err, Daemon().Caps)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	c, err = Peer(accepted(t, exec.Command(exe)))
	if err != nil || c.UID != 0 || c.Caps != 0 {
		t.Fatalf("a root peer that exited: %v %v, want uid 0 with no capability", c, err)
	}
}
