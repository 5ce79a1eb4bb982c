package handover

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func pair(t *testing.T) (daemon, successor *Conn) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "x.handover")
	ln, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	accepted := make(chan *Conn, 1)
	go func() {
		c, err := Accept(ln)
		if err != nil {
			t.Error(err)
		}
		accepted <- c
	}()
	successor, err = Dial(path)
	if err != nil {
		t.Fatal(err)
	}
	daemon = <-accepted
	t.Cleanup(func() { daemon.Close(); successor.Close() })
	if daemon.Peer != os.Getpid() || successor.Peer != os.Getpid() {
		t.Fatalf("peer pids %d, %d; want %d", daemon.Peer, successor.Peer, os.Getpid())
	}
	return daemon, successor
}

func memfd(t *testing.T, content string) *os.File {
	t.Helper()
	fd, err := unix.MemfdCreate("handover-test", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "memfd")
	if _, err := f.WriteString(content); err != nil {
		t.Fatal(err)
	}
	return f
}

// TestStateWithManyDescriptors sends a state larger than one packet with
// more descriptors than one packet holds, and checks every descriptor
// arrives in order.
func TestStateWithManyDescriptors(t *testing.T) {
	daemon, successor := pair(t)
	if err := successor.SendHello(Hello{Protocol: Protocol, Version: "v", Pid: os.Getpid()}); err != nil {
		t.Fatal(err)
	}
	if h, err := daemon.ReadHello(); err != nil || h.Version != "v" {
		t.Fatalf("hello %+v, %v", h, err)
	}
	const n = 600
	files := make([]*os.File, n)
	for i := range files {
		files[i] = memfd(t, fmt.Sprint(i))
	}
	big := json.RawMessage(`"` + strings.Repeat("x", 200<<10) + `"`)
	st := State{Parts: []Part{{Name: "a", State: big, Files: 250}, {Name: "b", State: json.RawMessage(`{"k":1}`), Files: n - 250}}}
	errc := make(chan error, 1)
	go func() { errc <- daemon.SendState(st, files) }()
	got, gotFiles, err := successor.ReadState()
	if err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		f.Close()
	}
	defer CloseFiles(gotFiles)
	if len(got.Parts) != 2 || string(got.Parts[0].State) != string(big) || string(got.Parts[1].State) != `{"k":1}` {
		t.Fatalf("state came back different: %d parts", len(got.Parts))
	}
	split, err := Split(got, gotFiles)
	if err != nil {
		t.Fatal(err)
	}
	if len(split["a"]) != 250 || len(split["b"]) != n-250 {
		t.Fatalf("split %d/%d", len(split["a"]), len(split["b"]))
	}
	for i, f := range gotFiles {
		b, err := io.ReadAll(io.NewSectionReader(f, 0, 16))
		if err != nil || string(b) != fmt.Sprint(i) {
			t.Fatalf("descriptor %d holds %q (%v)", i, b, err)
		}
	}
	if err := successor.SendVerdict(Verdict{Taken: true}); err != nil {
		t.Fatal(err)
	}
	if v, err := daemon.ReadVerdict(); err != nil || !v.Taken {
		t.Fatalf("verdict %+v, %v", v, err)
	}
}

func TestOtherProtocolRefused(t *testing.T) {
	daemon, successor := pair(t)
	if err := successor.SendHello(Hello{Protocol: Protocol + 1, Version: "9.9.9", Pid: 42}); err != nil {
		t.Fatal(err)
	}
	_, err := daemon.ReadHello()
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("protocol %d", Protocol+1)) ||
		!strings.Contains(err.Error(), fmt.Sprintf("protocol %d", Protocol)) {
		t.Fatalf("ReadHello of another protocol: %v; want an error naming both", err)
	}
	if err := daemon.SendRefusal(err.Error()); err != nil {
		t.Fatal(err)
	}
	if _, err := successor.ReadHello(); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("successor read %v; want the refusal", err)
	}
}

func TestStateCountsMustMatch(t *testing.T) {
	daemon, _ := pair(t)
	err := daemon.SendState(State{Parts: []Part{{Name: "a", Files: 2}}}, []*os.File{memfd(t, "x")})
	if err == nil {
		t.Fatal("a state naming 2 descriptors was sent with 1")
	}
	if _, err := Split(State{Parts: []Part{{Name: "a", Files: 1}}}, nil); err == nil {
		t.Fatal("Split of a part naming more descriptors than there are succeeded")
	}
	// A part named twice: its state and its descriptors could come from
	// different places, and the first's descriptors from none.
	twice := State{Parts: []Part{{Name: "a", Files: 1}, {Name: "a", Files: 1}}}
	if _, err := Split(twice, make([]*os.File, 2)); err == nil || !strings.Contains(err.Error(), "a") {
		t.Fatalf("Split of a part named twice: %v; want an error naming it", err)
	}
}

// TestDialChecksOwner: a socket that belongs to another uid is not a
// daemon of ours.
func TestDialChecksOwner(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("SKIP: needs root to give the socket to another uid")
	}
	path := filepath.Join(t.TempDir(), "x.handover")
	ln, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if err := os.Chown(path, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if _, err := Dial(path); err == nil || !strings.Contains(err.Error(), "uid 65534") {
		t.Fatalf("Dial of a socket owned by uid 65534: %v", err)
	}
}

func TestListenMode(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.handover")
	ln, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Fatalf("hand-over socket mode %v, want 0600", st.Mode().Perm())
	}
	if _, err := Listen(path); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("second Listen: %v", err)
	}
}

// TestSendKeepsSocketsNonBlocking: sending a duplicate of a serving
// socket leaves the socket in the mode its server needs (os.File.Fd
// would make it blocking, and the mode is shared by every duplicate).
func TestSendKeepsSocketsNonBlocking(t *testing.T) {
	daemon, successor := pair(t)
	ln, err := Listen(filepath.Join(t.TempDir(), "served"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	nonblocking := func() bool {
		raw, err := ln.SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		var fl int
		raw.Control(func(fd uintptr) { fl, err = unix.FcntlInt(fd, unix.F_GETFL, 0) })
		if err != nil {
			t.Fatal(err)
		}
		return fl&unix.O_NONBLOCK != 0
	}
	if !nonblocking() {
		t.Fatal("a Go listener starts blocking?")
	}
	dup, err := ln.File()
	if err != nil {
		t.Fatal(err)
	}
	defer dup.Close()
	errc := make(chan error, 1)
	go func() {
		errc <- daemon.SendState(State{Parts: []Part{{Name: "s", State: json.RawMessage(`1`), Files: 1}}}, []*os.File{dup})
	}()
	_, got, err := successor.ReadState()
	if err != nil {
		t.Fatal(err)
	}
	CloseFiles(got)
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if !nonblocking() {
		t.Fatal("sending a duplicate of the listener made it blocking")
	}
	dup.Fd() // what a send through Fd does
	if nonblocking() {
		t.Fatal("os.File.Fd left the listener non-blocking: this test checks nothing")
	}
}
