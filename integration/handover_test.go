package integration

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gdsfs/gdsfs/daemon/handover"
	"github.com/gdsfs/gdsfs/ipc"
)

// TestHandoverKeepsMountLeasesAndCache: with 1 GiB of files resident, a
// consumer holding a lease and a reader with a file open through the
// mount, a second `gdsfs mount` of the same SOURCE on the same mount
// point takes over. The first daemon exits 0 without unmounting; the
// reader's next read succeeds; the lease's bytes are still right and its
// release is counted by the successor; the successor holds every file
// resident without reading any byte from SOURCE; a file changed just
// before the switch is not served stale.
func TestHandoverKeepsMountLeasesAndCache(t *testing.T) {
	src := t.TempDir()
	const files, size = 8, 128 << 20
	var names []string
	for i := range files {
		name := fmt.Sprintf("w%d.bin", i)
		randomFile(t, filepath.Join(src, name), size, i+1)
		names = append(names, name)
	}
	randomFile(t, filepath.Join(src, "changed.bin"), 1<<20, 99)
	// staging.racy_window=0: a file changed within the window before the
	// switch would not be handed over (staging's tests cover that rule),
	// and these were all written just now.
	m := startMount(t, src, "staging.capacity=2GiB", "staging.racy_window=0s")
	for _, n := range append(names, "changed.bin") {
		leaseSum(t, m.path(n))
	}
	waitStat(t, m, "leases_active", 0)
	before := statsOf(t, m)
	if got := before["staged_files"].(float64); got != files+1 {
		t.Fatalf("staged_files %v before the switch, want %d", got, files+1)
	}

	h := hold(t, m.path(names[0]))
	reader, err := os.Open(m.path(names[1]))
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	want, err := os.ReadFile(filepath.Join(src, names[1]))
	if err != nil {
		t.Fatal(err)
	}
	first := make([]byte, 1<<20)
	if _, err := io.ReadFull(reader, first); err != nil || !bytes.Equal(first, want[:1<<20]) {
		t.Fatalf("first read through the mount: %v", err)
	}
	randomFile(t, filepath.Join(src, "changed.bin"), 1<<20, 100)

	next := startMountAt(t, src, m.mnt, "staging.capacity=2GiB", "staging.racy_window=0s", "ipc.socket="+m.sock)
	next.sock = m.sock // the successor serves the predecessor's lease socket
	// It exits once it let go, a message before the successor's READY.
	if err := <-m.exited; err != nil {
		t.Fatalf("the first daemon exited with %v after handing over\n%s", err, m.log)
	}
	if !strings.Contains(m.log.String(), "handed the mount over") {
		t.Fatalf("the first daemon's log does not say it handed over:\n%s", m.log)
	}

	rest := make([]byte, len(want)-len(first))
	if _, err := io.ReadFull(reader, rest); err != nil || !bytes.Equal(rest, want[len(first):]) {
		t.Fatalf("reading on after the switch through the file opened before it: %v", err)
	}
	if got := h.sum(t); got[0]["sha256"] != h.first[0]["sha256"] {
		t.Fatalf("the held lease reads %v after the switch, %v before", got[0]["sha256"], h.first[0]["sha256"])
	}
	after := statsOf(t, next)
	for _, k := range []string{"bytes_posix", "bytes_cufile", "bytes_host"} {
		if before[k] != after[k] {
			t.Errorf("%s %v after the switch, %v before: the successor read SOURCE again", k, after[k], before[k])
		}
	}
	if got := after["staged_files"].(float64); got != files {
		t.Errorf("staged_files %v after the switch, want %d (the changed file dropped)", got, files)
	}
	if got := after["leases_active"].(float64); got != 1 {
		t.Errorf("leases_active %v after the switch, want the held lease's 1", got)
	}
	for _, n := range names {
		if res := leaseSum(t, next.path(n)); res["sha256"] != sha(t, filepath.Join(src, n)) {
			t.Errorf("%s leased after the switch: wrong bytes", n)
		}
	}
	if res := leaseSum(t, next.path("changed.bin")); res["sha256"] != sha(t, filepath.Join(src, "changed.bin")) {
		t.Errorf("changed.bin leased after the switch: stale bytes")
	}
	if got := sha(t, next.path("changed.bin")); got != sha(t, filepath.Join(src, "changed.bin")) {
		t.Errorf("changed.bin read through the mount after the switch: stale bytes")
	}
	if err := h.release(); err != nil {
		t.Fatalf("the holder's release through the successor: %v", err)
	}
	waitStat(t, next, "leases_active", 0)
	if final := statsOf(t, next); final["bytes_posix"].(float64)-before["bytes_posix"].(float64) > 1<<20 {
		t.Errorf("the successor read %v bytes from SOURCE; only changed.bin (1 MiB) was to be read",
			final["bytes_posix"].(float64)-before["bytes_posix"].(float64))
	}
}

// TestHandoverOtherProtocolRefused: a successor speaking another
// hand-over protocol is refused before anything stops, with an error
// naming both protocols, and the daemon serves on.
func TestHandoverOtherProtocolRefused(t *testing.T) {
	src := t.TempDir()
	randomFile(t, filepath.Join(src, "a.bin"), 1<<16, 1)
	m := startMount(t, src)
	c, err := handover.Dial(handover.Path(ipc.DefaultSocket(m.mnt)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.SendHello(handover.Hello{Protocol: handover.Protocol + 1, Version: "99.0.0", Pid: os.Getpid(),
		Source: src, Mountpoint: m.mnt}); err != nil {
		t.Fatal(err)
	}
	_, err = c.ReadHello()
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("protocol %d", handover.Protocol+1)) {
		t.Fatalf("a hello of protocol %d was answered %v; want a refusal naming it", handover.Protocol+1, err)
	}
	if got := sha(t, m.path("a.bin")); got != sha(t, filepath.Join(src, "a.bin")) {
		t.Fatal("the daemon does not serve on after refusing a successor")
	}
}

// TestHandoverOfAnotherSourceRefused: a `gdsfs mount` of another SOURCE
// on a served mount point fails naming both, and the mount is untouched.
func TestHandoverOfAnotherSourceRefused(t *testing.T) {
	src, other := t.TempDir(), t.TempDir()
	randomFile(t, filepath.Join(src, "a.bin"), 1<<16, 1)
	m := startMount(t, src)
	out, err := exec.Command(bins.gdsfs, "mount", other, m.mnt).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "not SOURCE "+other) {
		t.Fatalf("gdsfs mount of another SOURCE on a served mount point: %v\n%s", err, out)
	}
	if got := sha(t, m.path("a.bin")); got != sha(t, filepath.Join(src, "a.bin")) {
		t.Fatal("the daemon does not serve on after refusing another SOURCE")
	}
}

// TestHandoverTwiceInARow: the daemon that took a mount over hands it over
// in its turn (an upgrade after an upgrade): each predecessor exits 0,
// the third daemon serves the files still resident, none read again.
func TestHandoverTwiceInARow(t *testing.T) {
	src := t.TempDir()
	randomFile(t, filepath.Join(src, "a.bin"), 4<<20, 1)
	m := startMount(t, src, "staging.racy_window=0s")
	want := sha(t, filepath.Join(src, "a.bin"))
	if res := leaseSum(t, m.path("a.bin")); res["sha256"] != want {
		t.Fatal("a.bin leased before the switches: wrong bytes")
	}
	waitStat(t, m, "leases_active", 0)
	before := statsOf(t, m)
	prev := m
	for i := 1; i <= 2; i++ {
		next := startMountAt(t, src, m.mnt, "staging.racy_window=0s", "ipc.socket="+m.sock)
		next.sock = m.sock
		if err := <-prev.exited; err != nil {
			t.Fatalf("daemon %d exited with %v after handing over\n%s", i, err, prev.log)
		}
		if !next.log.waitFor("took over") {
			t.Fatalf("daemon %d does not say it took over:\n%s", i+1, next.log)
		}
		prev = next
	}
	if res := leaseSum(t, prev.path("a.bin")); res["sha256"] != want {
		t.Fatal("a.bin leased after two switches: wrong bytes")
	}
	if got, was := statsOf(t, prev)["bytes_host"], before["bytes_host"]; got != was {
		t.Errorf("bytes_host %v after two switches, %v before: a successor read SOURCE again", got, was)
	}
}

// TestHandoverPastASilentConnection: a connection to the hand-over
// socket that never says hello holds up nothing: a successor that comes
// after it takes the mount over, and the silent one is closed.
func TestHandoverPastASilentConnection(t *testing.T) {
	src := t.TempDir()
	randomFile(t, filepath.Join(src, "a.bin"), 1<<16, 1)
	m := startMount(t, src)
	silent, err := handover.Dial(handover.Path(ipc.DefaultSocket(m.mnt)))
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	next := startMountAt(t, src, m.mnt, "ipc.socket="+m.sock)
	next.sock = m.sock
	if err := <-m.exited; err != nil {
		t.Fatalf("the first daemon exited with %v after handing over\n%s", err, m.log)
	}
	if _, err := silent.ReadHello(); err == nil {
		t.Error("the silent connection was answered a hello")
	}
	if got := sha(t, next.path("a.bin")); got != sha(t, filepath.Join(src, "a.bin")) {
		t.Fatal("a.bin read through the successor: wrong bytes")
	}
}

// relay stands between m's daemon and a successor it starts: it takes
// the hand-over socket's path (the daemon's listener answers on under
// another name), passes the hellos and the state on, and returns the
// successor's verdict unanswered. restore gives the path back.
type relay struct {
	succ, pred *handover.Conn
	out        *syncBuffer
	exited     chan error
	restore    func()
}

// hello, when not nil, changes the daemon's hello on its way.
func startRelay(t *testing.T, m *mount, src string, hello func(*handover.Hello)) (*relay, handover.Verdict) {
	t.Helper()
	path := handover.Path(ipc.DefaultSocket(m.mnt))
	daemonPath := path + ".daemon"
	if err := os.Rename(path, daemonPath); err != nil {
		t.Fatal(err)
	}
	ln, err := handover.Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	r := &relay{out: &syncBuffer{}, exited: make(chan error, 1)}
	r.restore = func() {
		ln.Close()
		if err := os.Rename(daemonPath, path); err != nil {
			t.Fatal(err)
		}
	}
	accepted := make(chan *handover.Conn, 1)
	go func() {
		c, err := handover.Accept(ln)
		if err == nil {
			accepted <- c
		}
	}()
	cmd := exec.Command(bins.gdsfs, "mount", "--set", "log.format=console", "--set", "ipc.socket="+m.sock, src, m.mnt)
	cmd.Stdout, cmd.Stderr = r.out, r.out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill() })
	go func() { r.exited <- cmd.Wait() }()
	select {
	case r.succ = <-accepted:
	case err := <-r.exited:
		t.Fatalf("the successor exited before connecting: %v\n%s", err, r.out)
	}
	t.Cleanup(func() { r.succ.Close() })
	if r.pred, err = handover.Dial(daemonPath); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.pred.Close() })
	h, err := r.succ.ReadHello()
	if err == nil {
		err = r.pred.SendHello(h)
	}
	if err == nil {
		h, err = r.pred.ReadHello()
	}
	if err == nil {
		if hello != nil {
			hello(&h)
		}
		err = r.succ.SendHello(h)
	}
	if err != nil {
		t.Fatalf("relaying the hellos: %v", err)
	}
	st, files, err := r.pred.ReadState()
	if err == nil {
		err = r.succ.SendState(st, files)
		handover.CloseFiles(files)
	}
	if err != nil {
		t.Fatalf("relaying the state: %v", err)
	}
	v, err := r.succ.ReadVerdict()
	if err != nil {
		t.Fatalf("the successor's verdict: %v\n%s", err, r.out)
	}
	return r, v
}

// TestHandoverVerdictDeadline: a successor whose verdict does not reach
// the running daemon within shutdown.handover_timeout (a relay on the
// hand-over socket withholds it, as a successor stalled adopting over a
// hung SOURCE would) does not freeze the mount. The daemon tells the
// successor and serves on; the successor, which adopted everything and
// served nothing, lets go and exits non-zero saying why; a file open
// through the mount reads on, and a later successor takes over.
func TestHandoverVerdictDeadline(t *testing.T) {
	src := t.TempDir()
	randomFile(t, filepath.Join(src, "a.bin"), 1<<20, 1)
	randomFile(t, filepath.Join(src, "b.bin"), 1<<20, 2)
	m := startMount(t, src, "shutdown.handover_timeout=1s")
	want, err := os.ReadFile(filepath.Join(src, "a.bin"))
	if err != nil {
		t.Fatal(err)
	}
	reader, err := os.Open(m.path("a.bin"))
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	first := make([]byte, len(want)/2)
	if _, err := io.ReadFull(reader, first); err != nil || !bytes.Equal(first, want[:len(first)]) {
		t.Fatalf("first read through the mount: %v", err)
	}

	r, sv := startRelay(t, m, src, nil)
	if !sv.Taken {
		t.Fatalf("the successor's verdict: %+v\n%s", sv, r.out)
	}
	// Withheld: the daemon's deadline passes. (A guard against a daemon
	// that would wait for ever, as it once did.)
	r.pred.SetDeadline(time.Now().Add(20 * time.Second))
	v, err := r.pred.ReadVerdict()
	if err != nil || v.Taken || !strings.Contains(v.Error, "shutdown.handover_timeout (1s)") {
		t.Fatalf("the daemon's answer to a withheld verdict: %+v, %v\n%s", v, err, m.log)
	}
	if err := r.succ.SendVerdict(v); err != nil {
		t.Fatal(err)
	}
	if err := <-r.exited; err == nil || !strings.Contains(r.out.String(), "kept the mount: the running daemon serves on: no verdict from the successor within shutdown.handover_timeout") {
		t.Fatalf("the successor told the daemon kept the mount exited with %v:\n%s", err, r.out)
	}
	if strings.Contains(r.out.String(), "took over") {
		t.Errorf("the successor says it took over:\n%s", r.out)
	}
	if !m.log.waitFor("the successor did not take the mount; serving on") {
		t.Fatalf("the daemon does not say it serves on:\n%s", m.log)
	}

	rest := make([]byte, len(want)-len(first))
	if _, err := io.ReadFull(reader, rest); err != nil || !bytes.Equal(rest, want[len(first):]) {
		t.Fatalf("reading on through the file opened before: %v", err)
	}
	if got := sha(t, m.path("b.bin")); got != sha(t, filepath.Join(src, "b.bin")) {
		t.Fatal("b.bin read through the mount after the refused hand-over: wrong bytes")
	}
	r.restore()
	next := startMountAt(t, src, m.mnt, "ipc.socket="+m.sock)
	next.sock = m.sock
	if err := <-m.exited; err != nil {
		t.Fatalf("the daemon exited with %v after handing over\n%s", err, m.log)
	}
	if got := sha(t, next.path("b.bin")); got != sha(t, filepath.Join(src, "b.bin")) {
		t.Fatal("b.bin read through the later successor: wrong bytes")
	}
}

// TestHandoverTrustsNoReportedPid: a successor whose exchange breaks off
// after its verdict serves only if the process at the other end of its
// socket exited, never on the pid the running daemon's hello reported
// (meaningless across pid namespaces; here the relay reports one that
// has exited). It lets go and exits non-zero; the daemon serves on.
func TestHandoverTrustsNoReportedPid(t *testing.T) {
	src := t.TempDir()
	randomFile(t, filepath.Join(src, "a.bin"), 1<<20, 1)
	m := startMount(t, src, "shutdown.handover_timeout=1s")
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	r, sv := startRelay(t, m, src, func(h *handover.Hello) { h.Pid = gone.ProcessState.Pid() })
	if !sv.Taken {
		t.Fatalf("the successor's verdict: %+v\n%s", sv, r.out)
	}
	r.succ.Close() // the exchange breaks off
	tookOver := make(chan bool, 1)
	go func() { tookOver <- r.out.waitFor("took over") }()
	select {
	case err := <-r.exited:
		if err == nil || !strings.Contains(r.out.String(), "which still runs: it keeps the mount") {
			t.Fatalf("the successor exited with %v:\n%s", err, r.out)
		}
	case <-tookOver:
		t.Fatalf("the successor serves the mount while the daemon runs:\n%s", r.out)
	}
	if !m.log.waitFor("the successor did not take the mount; serving on") {
		t.Fatalf("the daemon does not say it serves on:\n%s", m.log)
	}
	if got := sha(t, m.path("a.bin")); got != sha(t, filepath.Join(src, "a.bin")) {
		t.Fatal("a.bin read through the mount after the broken-off hand-over: wrong bytes")
	}
	r.restore()
}
