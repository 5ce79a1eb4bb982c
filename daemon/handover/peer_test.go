package handover

import (
	"bufio"
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// A test binary started with peerChildEnv set listens on the path it
// names, says "listening" on stdout, and exits when its stdin closes.
const peerChildEnv = "GDSFS_HANDOVER_TEST_LISTEN"

func TestMain(m *testing.M) {
	if path := os.Getenv(peerChildEnv); path != "" {
		ln, err := Listen(path)
		if err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(2)
		}
		os.Stdout.WriteString("listening\n")
		bufio.NewReader(os.Stdin).ReadString('\n')
		ln.Close()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestPeerAliveFollowsTheProcess: the daemon a successor dialled is
// alive while its process runs and not once it exited, told by the
// process itself (its pidfd), not by a pid it reported.
func TestPeerAliveFollowsTheProcess(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.handover")
	child := exec.Command(os.Args[0])
	child.Env = append(os.Environ(), peerChildEnv+"="+path)
	child.Stderr = os.Stderr
	stdin, err := child.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer child.Process.Kill()
	if line, err := bufio.NewReader(stdout).ReadString('\n'); err != nil || line != "listening\n" {
		t.Fatalf("the child said %q (%v)", line, err)
	}
	c, err := Dial(path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.pidfd < 0 {
		t.Log("no SO_PEERPIDFD here (Linux < 6.5): checking the fallback on the peer's pid")
	}
	if alive, err := c.PeerAlive(); err != nil || !alive {
		t.Fatalf("PeerAlive while the daemon runs: %v, %v", alive, err)
	}
	stdin.Close()
	if err := child.Wait(); err != nil {
		t.Fatalf("the child: %v", err)
	}
	if alive, err := c.PeerAlive(); err != nil || alive {
		t.Fatalf("PeerAlive once the daemon exited: %v, %v", alive, err)
	}
}

// TestPeerAliveUnknownWithoutPid: with no process descriptor and no
// visible pid (a peer in a pid namespace this one does not see), the
// answer is an error, never "exited".
func TestPeerAliveUnknownWithoutPid(t *testing.T) {
	c := &Conn{pidfd: -1, Peer: 0}
	if alive, err := c.PeerAlive(); err == nil {
		t.Fatalf("PeerAlive with nothing to tell it by: %v, no error", alive)
	}
}

// TestOversizedMessageRefused: a header announcing more than any real
// state is refused from the header alone, naming the size and the cap.
func TestOversizedMessageRefused(t *testing.T) {
	for _, tc := range []struct {
		bytes, files uint32
		want         string
	}{
		{MaxMessage + 1, 0, "a message of 536870913 bytes is beyond any real state (at most 536870912)"},
		{1 << 30, 0, "a message of 1073741824 bytes is beyond any real state (at most 536870912)"},
		{10, MaxFiles + 1, "a message of 1048577 descriptors is beyond any real state (at most 1048576)"},
	} {
		daemon, successor := pair(t)
		var h [headerLen]byte
		binary.LittleEndian.PutUint32(h[:4], tc.bytes)
		binary.LittleEndian.PutUint32(h[4:], tc.files)
		if _, err := daemon.c.Write(h[:]); err != nil {
			t.Fatal(err)
		}
		daemon.Close() // nothing follows the header
		_, _, err := successor.ReadState()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("a header of %d bytes and %d descriptors: %v; want %q", tc.bytes, tc.files, err, tc.want)
		}
	}
}

// TestSendVerdictNowNeverWaits: with the socket full (the other side
// reads nothing), the verdict is refused at once instead of waiting.
func TestSendVerdictNowNeverWaits(t *testing.T) {
	daemon, _ := pair(t)
	raw, err := daemon.c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var serr error
	raw.Control(func(fd uintptr) {
		for serr == nil {
			serr = unix.Sendmsg(int(fd), make([]byte, 4096), nil, nil, unix.MSG_DONTWAIT)
		}
	})
	if serr != unix.EAGAIN {
		t.Fatalf("filling the socket: %v", serr)
	}
	if err := daemon.SendVerdictNow(Verdict{Error: "x"}); err != unix.EAGAIN {
		t.Fatalf("a verdict on a full socket: %v, want EAGAIN", err)
	}
}
