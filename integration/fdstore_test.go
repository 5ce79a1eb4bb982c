package integration

import (
	"bufio"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/internal/mountinfo"
)

// manager plays systemd's part for one service: it reads the daemon's
// notifications, keeps the descriptors it stores (FDSTORE=1, FDNAME=),
// drops those it removes (FDSTOREREMOVE=1), answers BARRIER=1, and
// passes what it keeps to the next daemon as $LISTEN_FDS. As systemd
// does, it keeps every descriptor stored under a name, newest first,
// drops one that is the same open file as one it keeps, and removes
// every descriptor of a name.
type manager struct {
	path  string
	mu    sync.Mutex
	store []stored
	// status gets every STATUS= line; ready every MAINPID of READY=1.
	status chan string
	ready  chan int
	// max is FileDescriptorStoreMax= (passed as $FDSTORE): a descriptor
	// stored past it is closed, as systemd does, and the daemon is not
	// told. 0: 4096. Set with mu held, as holdBarrier.
	max int
	// holdBarrier: BARRIER=1 is not answered (its descriptor is kept
	// open until the test ends), as by a manager that hangs.
	holdBarrier bool
	held        []int
}

// stored is one descriptor in the manager's store.
type stored struct {
	name string
	f    *os.File
}

// sameFile says whether descriptors a and b of this process are the same
// open file (kcmp KCMP_FILE), as systemd's same_fd does.
func sameFile(a, b int) bool {
	pid := uintptr(os.Getpid())
	r, _, errno := unix.Syscall6(unix.SYS_KCMP, pid, pid, 0, uintptr(a), uintptr(b), 0)
	return errno == 0 && r == 0
}

// names are the names in the store, newest first.
func (m *manager) names() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for _, s := range m.store {
		out = append(out, s.name)
	}
	return out
}

func newManager(t *testing.T) *manager {
	t.Helper()
	dir, err := os.MkdirTemp("", "gdsfs-manager-")
	if err != nil {
		t.Fatal(err)
	}
	m := &manager{path: filepath.Join(dir, "notify"),
		status: make(chan string, 1024), ready: make(chan int, 16)}
	l, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: m.path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		l.Close()
		os.RemoveAll(dir)
		m.mu.Lock()
		for _, s := range m.store {
			s.f.Close()
		}
		for _, fd := range m.held {
			unix.Close(fd)
		}
		m.mu.Unlock()
	})
	go func() {
		buf, oob := make([]byte, 4096), make([]byte, unix.CmsgSpace(4*253))
		for {
			n, oobn, _, _, err := l.ReadMsgUnix(buf, oob)
			if err != nil {
				return
			}
			var fds []int
			if msgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
				for _, msg := range msgs {
					got, _ := unix.ParseUnixRights(&msg)
					fds = append(fds, got...)
				}
			}
			m.handle(string(buf[:n]), fds)
		}
	}()
	return m
}

func (m *manager) handle(msg string, fds []int) {
	fields := map[string]string{}
	for _, l := range strings.Split(msg, "\n") {
		k, v, _ := strings.Cut(l, "=")
		fields[k] = v
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case fields["FDSTORE"] == "1" && len(fds) == 1:
		if len(m.store) >= m.storeMax() {
			unix.Close(fds[0])
			return
		}
		for _, s := range m.store {
			if sameFile(int(s.f.Fd()), fds[0]) {
				unix.Close(fds[0])
				return
			}
		}
		m.store = append([]stored{{fields["FDNAME"], os.NewFile(uintptr(fds[0]), fields["FDNAME"])}}, m.store...)
		return
	case fields["FDSTOREREMOVE"] == "1":
		m.store = slices.DeleteFunc(m.store, func(s stored) bool {
			if s.name == fields["FDNAME"] {
				s.f.Close()
				return true
			}
			return false
		})
	}
	if _, ok := fields["BARRIER"]; ok && m.holdBarrier {
		m.held = append(m.held, fds...)
		fds = nil
	}
	for _, fd := range fds {
		unix.Close(fd) // BARRIER=1's descriptor, or one not kept
	}
	if s, ok := fields["STATUS"]; ok {
		m.status <- s
	}
	if _, ok := fields["READY"]; ok {
		pid, _ := strconv.Atoi(fields["MAINPID"])
		m.ready <- pid
	}
}

// storeMax is max or its default; m.mu is held.
func (m *manager) storeMax() int {
	if m.max > 0 {
		return m.max
	}
	return 4096
}

// waitStatus waits for a STATUS= line containing want.
func (m *manager) waitStatus(t *testing.T, want string) {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case s := <-m.status:
			if strings.Contains(s, want) {
				return
			}
		case <-timeout:
			t.Fatalf("no STATUS= saying %q within 30s", want)
		}
	}
}

// mount is start for a mount of src on mnt with lease socket sock.
func (m *manager) mount(t *testing.T, src, mnt, sock string, args ...string) *mount {
	t.Helper()
	cmd, log, exited := m.start(t, args...)
	return &mount{t: t, src: src, mnt: mnt, sock: sock, cmd: cmd, log: log, exited: exited}
}

// start runs `gdsfs mount` as the service's main process, passing what
// the store holds as systemd would.
func (m *manager) start(t *testing.T, args ...string) (*exec.Cmd, *syncBuffer, chan error) {
	t.Helper()
	m.mu.Lock()
	var names []string
	// Dups: the manager may drop its own while the daemon starts.
	var files []*os.File
	for _, s := range m.store {
		fd, err := unix.FcntlInt(s.f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			m.mu.Unlock()
			t.Fatal(err)
		}
		names = append(names, s.name)
		files = append(files, os.NewFile(uintptr(fd), s.name))
	}
	most := m.storeMax()
	m.mu.Unlock()
	closeFiles := func() {
		for _, f := range files {
			f.Close()
		}
	}
	env := ""
	if len(files) > 0 {
		env = fmt.Sprintf("LISTEN_FDS=%d LISTEN_FDNAMES=%s LISTEN_PID=$$ ", len(files), strings.Join(names, ":"))
	}
	cmd := exec.Command("sh", "-c", env+`exec "$@"`, "sh")
	cmd.Args = append(cmd.Args, append([]string{bins.gdsfs}, args...)...)
	cmd.Env = append(os.Environ(), "NOTIFY_SOCKET="+m.path, fmt.Sprintf("FDSTORE=%d", most))
	cmd.ExtraFiles = files
	log := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = log, log
	err := cmd.Start()
	closeFiles() // the daemon has its own: a listener the store drops must end
	if err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case pid := <-m.ready:
		if pid != cmd.Process.Pid {
			t.Fatalf("READY=1 from pid %d, not the daemon's %d", pid, cmd.Process.Pid)
		}
	case err := <-exited:
		t.Fatalf("gdsfs exited before mounting: %v\n%s", err, log)
	case <-time.After(30 * time.Second):
		cmd.Process.Signal(syscall.SIGQUIT) // the Go runtime writes every goroutine's stack to the log
		<-exited
		t.Fatalf("no READY=1 within 30s\n%s", log)
	}
	return cmd, log, exited
}

// managed is a daemon under the test's service manager with files
// resident, a consumer holding a lease on the first, and a reader with
// the second open through the mount, half read.
type managed struct {
	t          *testing.T
	src, mnt   string
	args       []string
	names      []string
	mgr        *manager
	m          *mount
	before     map[string]any // stats once all was staged
	h          *holder
	want       []byte // the second file's bytes
	reader     *exec.Cmd
	readerIn   io.Writer
	readerOut  *bufio.Reader
	files, len int
}

func newManaged(t *testing.T, sets ...string) *managed {
	needMount(t)
	need(t, "python3", "stat", "dd", "sha256sum")
	x := &managed{t: t, src: t.TempDir(), mnt: t.TempDir(), files: 4, len: 32 << 20}
	for i := range x.files {
		name := fmt.Sprintf("w%d.bin", i)
		randomFile(t, filepath.Join(x.src, name), x.len, i+1)
		x.names = append(x.names, name)
	}
	randomFile(t, filepath.Join(x.src, "changed.bin"), 1<<20, 99)
	randomFile(t, filepath.Join(x.src, "resized.bin"), 1<<20, 98)
	sock := filepath.Join(t.TempDir(), "lease.sock")
	// staging.racy_window=0: these files were all written just now (see
	// TestHandoverKeepsMountLeasesAndCache).
	x.args = []string{"mount", "--set", "log.format=console", "--set", "ipc.socket=" + sock,
		"--set", "staging.racy_window=0s"}
	for _, s := range sets {
		x.args = append(x.args, "--set", s)
	}
	x.args = append(x.args, x.src, x.mnt)
	x.mgr = newManager(t)
	x.m = x.mgr.mount(t, x.src, x.mnt, sock, x.args...)
	for _, n := range append(x.names, "changed.bin") {
		leaseSum(t, x.m.path(n))
	}
	x.mgr.waitStatus(t, fmt.Sprintf("%d files", x.files+1))
	x.before = statsOf(t, x.m)
	// The kernel caches resized.bin's entry and attributes (for long,
	// where change detection reports SOURCE's changes).
	if fi, err := os.Stat(x.m.path("resized.bin")); err != nil || fi.Size() != 1<<20 {
		t.Fatalf("stat of resized.bin through the mount: %v %v", fi, err)
	}

	x.h = hold(t, x.m.path(x.names[0]))
	// The reader is a process of its own: a process that closes a file of
	// the mount while no daemon serves it waits for one (FLUSH), and the
	// test's own forks close their copies of its descriptors when they
	// exec: the restarted daemon's start would wait on itself.
	x.want, _ = os.ReadFile(filepath.Join(x.src, x.names[1]))
	// After the restart it also asks for the file's attributes by its
	// descriptor, past the kernel's cache (a handle the daemon before
	// opened: after a crash, one the new daemon never saw), and closes a
	// copy of it, which the kernel tells the daemon of (FLUSH).
	reader := exec.Command("sh", "-c", `exec 3<"$1"; dd bs=1M count=16 iflag=fullblock status=none <&3 | sha256sum; read go; dd bs=1M count=16 iflag=fullblock status=none <&3 | sha256sum; stat --cached=never -c %s - <&3; python3 -c 'import os; os.close(3)' && echo closed`, "sh", x.m.path(x.names[1]))
	x.reader = reader
	x.readerIn, _ = reader.StdinPipe()
	readerOut, _ := reader.StdoutPipe()
	if err := reader.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reader.Process.Kill(); reader.Wait() })
	x.readerOut = bufio.NewReader(readerOut)
	if got, err := lineOrStacks(t, x.readerOut, x.m); err != nil || got != halfSum(x.want[:x.len/2]) {
		t.Fatalf("read before the restart: %q %v", got, err)
	}
	return x
}

// exit waits for the daemon to exit after a signal: its exit error, or
// an error saying it did not exit (a guard, not a timing assumption).
func (m *mount) exit() error {
	select {
	case err := <-m.exited:
		if err != nil {
			return fmt.Errorf("exited with %w", err)
		}
		return nil
	case <-time.After(60 * time.Second):
		return errors.New("still running 60s after the signal")
	}
}

func halfSum(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) + "  -\n" }

// lineOrStacks is r's next line, from a process reading through the
// mount serving serves; a guard (not a timing assumption) fails the test
// with that daemon's goroutine stacks after 60s without one.
func lineOrStacks(t *testing.T, r *bufio.Reader, serving *mount) (string, error) {
	t.Helper()
	type res struct {
		s   string
		err error
	}
	c := make(chan res, 1)
	go func() { s, err := r.ReadString('\n'); c <- res{s, err} }()
	select {
	case r := <-c:
		return r.s, r.err
	case <-time.After(60 * time.Second):
		if serving != nil {
			serving.cmd.Process.Signal(syscall.SIGQUIT) // every goroutine's stack to the log
			<-serving.exited
			t.Fatalf("no answer from a process reading through the mount within 60s\n%s", serving.log)
		}
		t.Fatal("no answer from a process reading through the mount within 60s")
		return "", nil
	}
}

// restart changes changed.bin while no daemon runs, starts the next
// daemon from the store and checks what every restart with the store
// keeps: the reader reads on, the consumer's mapping keeps its bytes,
// every resident file is served without reading SOURCE again and the
// changed one is not served stale.
func (x *managed) restart() *mount {
	t := x.t
	randomFile(t, filepath.Join(x.src, "changed.bin"), 1<<20, 100)
	randomFile(t, filepath.Join(x.src, "resized.bin"), 3<<20, 97)
	next := x.mgr.mount(t, x.src, x.mnt, x.m.sock, x.args...)
	t.Cleanup(next.stop)
	if !next.log.waitFor("recovered the mount") {
		t.Fatalf("the restarted daemon did not recover from the store:\n%s", next.log)
	}
	io.WriteString(x.readerIn, "go\n")
	if got, err := lineOrStacks(t, x.readerOut, next); err != nil || got != halfSum(x.want[x.len/2:]) {
		t.Fatalf("reading on after the restart through the file opened before it: %q %v", got, err)
	}
	if got, err := lineOrStacks(t, x.readerOut, next); err != nil || got != fmt.Sprintf("%d\n", x.len) {
		t.Fatalf("fstat, past the kernel's cache, of the file opened before the restart: %q %v (want its size %d)\n%s", got, err, x.len, next.log)
	}
	if got, err := lineOrStacks(t, x.readerOut, next); err != nil || got != "closed\n" {
		t.Fatalf("closing a descriptor of the file opened before the restart: %q %v (want it closed without an error)\n%s", got, err, next.log)
	}
	if got := x.h.sum(t); got[0]["sha256"] != x.h.first[0]["sha256"] {
		t.Fatalf("the consumer's mapping reads %v after the restart, %v before", got[0]["sha256"], x.h.first[0]["sha256"])
	}
	after := statsOf(t, next)
	if got := after["staged_files"].(float64); got != float64(x.files) {
		t.Errorf("staged_files %v after the restart, want %d (changed.bin dropped)\n%s", got, x.files, next.log)
	}
	for _, n := range x.names {
		if res := leaseSum(t, next.path(n)); res["sha256"] != sha(t, filepath.Join(x.src, n)) {
			t.Errorf("%s leased after the restart: wrong bytes", n)
		}
	}
	if got := sha(t, next.path("changed.bin")); got != sha(t, filepath.Join(x.src, "changed.bin")) {
		t.Errorf("changed.bin read after the restart: stale bytes")
	}
	// Changed while no daemon watched SOURCE: the restarted daemon has the
	// kernel drop what it cached of the mount.
	if !next.log.waitFor("the kernel dropped every cached entry and attribute") {
		t.Fatalf("the restarted daemon does not say the kernel dropped what it cached:\n%s", next.log)
	}
	if fi, err := os.Stat(next.path("resized.bin")); err != nil || fi.Size() != 3<<20 {
		t.Errorf("resized.bin through the mount after the restart: %v %v, want its new size %d (changed while no daemon ran)", fi, err, 3<<20)
	}
	final := statsOf(t, next)
	if d := final["bytes_posix"].(float64) - x.before["bytes_posix"].(float64); d > 1<<20 {
		t.Errorf("the restarted daemon read %v bytes from SOURCE; only changed.bin (1 MiB) was to be read", d)
	}
	return next
}

// TestCrashKeepsMountAndCache: under a service manager with a
// descriptor store, a daemon killed with SIGKILL loses neither the mount
// nor the staged files: the restarted daemon gets the FUSE connection,
// the lease socket and the regions back, serves the resident files
// without reading SOURCE, and does not serve a file changed while no
// daemon ran. A file open through the mount reads on; a consumer's
// mapping keeps its bytes.
func TestCrashKeepsMountAndCache(t *testing.T) {
	x := newManaged(t)
	x.m.cmd.Process.Signal(syscall.SIGKILL)
	<-x.m.exited
	x.restart()
	x.h.cmd.Process.Kill() // its connection ended with the first daemon
	x.h.cmd.Wait()
}

// TestRestartSignalKeepsMountLeasesAndCache: the signal a unit's restart
// sends (RestartKillSignal=SIGUSR2) makes the daemon keep everything a
// hand-over sends in the descriptor store and exit 0 without unmounting;
// the restarted daemon carries on from it as from a crash, and the
// consumer's connection and lease too: still counted, released through
// the new daemon. The reader's file is served by the daemon (no
// passthrough): its handle too is kept.
func TestRestartSignalKeepsMountLeasesAndCache(t *testing.T) {
	x := newManaged(t, "fuse.passthrough=off")
	x.m.cmd.Process.Signal(syscall.SIGUSR2)
	if err := x.m.exit(); err != nil {
		t.Fatalf("the daemon stopped for a restart: %v\n%s", err, x.m.log)
	}
	if !strings.Contains(x.m.log.String(), "kept the mount, the leases and the cache in the descriptor store") {
		t.Fatalf("the daemon's log does not say it kept the mount for the restart:\n%s", x.m.log)
	}
	next := x.restart()
	if got := statsOf(t, next)["leases_active"].(float64); got != 1 {
		t.Errorf("leases_active %v after the restart, want the held lease's 1", got)
	}
	if err := x.h.release(); err != nil {
		t.Fatalf("the holder's release through the restarted daemon: %v", err)
	}
	waitStat(t, next, "leases_active", 0)
}

// TestRestartSignalWithoutStoreStops: without a descriptor store the
// restart signal is a plain stop, which says so: the mount ends.
func TestRestartSignalWithoutStoreStops(t *testing.T) {
	src := t.TempDir()
	randomFile(t, filepath.Join(src, "a.bin"), 1<<20, 1)
	m := startMount(t, src)
	m.cmd.Process.Signal(syscall.SIGUSR2)
	if err := m.exit(); err != nil {
		t.Fatalf("the daemon stopped for a restart without a store: %v\n%s", err, m.log)
	}
	for _, want := range []string{"without a descriptor store", "unmounted cleanly"} {
		if !strings.Contains(m.log.String(), want) {
			t.Errorf("the daemon's log does not say %q:\n%s", want, m.log)
		}
	}
}

// TestCrashTwiceRecoversTheLatest: a daemon restarted after a crash
// replaces the store's content with its own (systemd keeps every
// descriptor stored under a name): no name is stored twice, and a second
// crash recovers what the second daemon staged, not the first's state.
func TestCrashTwiceRecoversTheLatest(t *testing.T) {
	needMount(t)
	src, mnt := t.TempDir(), t.TempDir()
	randomFile(t, filepath.Join(src, "a.bin"), 4<<20, 1)
	randomFile(t, filepath.Join(src, "b.bin"), 4<<20, 2)
	sock := filepath.Join(t.TempDir(), "lease.sock")
	args := []string{"mount", "--set", "log.format=console", "--set", "ipc.socket=" + sock,
		"--set", "staging.racy_window=0s", src, mnt}
	mgr := newManager(t)
	m := mgr.mount(t, src, mnt, sock, args...)
	t.Cleanup(func() { m.stop() }) // the daemon serving last
	leaseSum(t, m.path("a.bin"))
	mgr.waitStatus(t, "1 files")
	for i := 2; i <= 3; i++ {
		m.cmd.Process.Signal(syscall.SIGKILL)
		<-m.exited
		m = mgr.mount(t, src, mnt, sock, args...)
		if !m.log.waitFor("recovered the mount") {
			t.Fatalf("daemon %d did not recover from the store:\n%s", i, m.log)
		}
		if i == 2 {
			leaseSum(t, m.path("b.bin"))
			mgr.waitStatus(t, "2 files")
			names := mgr.names()
			slices.Sort(names)
			if c := slices.Compact(slices.Clone(names)); len(c) != len(names) {
				t.Fatalf("the store holds a name twice after a recovery: %q", names)
			}
		}
	}
	if got := statsOf(t, m)["staged_files"].(float64); got != 2 {
		t.Fatalf("staged_files %v after the second crash, want 2 (a.bin and b.bin)\n%s", got, m.log)
	}
	for _, n := range []string{"a.bin", "b.bin"} {
		if got := sha(t, m.path(n)); got != sha(t, filepath.Join(src, n)) {
			t.Errorf("%s after the second crash: wrong bytes", n)
		}
	}
}

// TestCrashStoreRefusedKeepsNoRegion: a restart that cannot use the store
// (here another fuse.max_read) mounts afresh and holds none of the
// regions it had begun to take over.
func TestCrashStoreRefusedKeepsNoRegion(t *testing.T) {
	needMount(t)
	src, mnt := t.TempDir(), t.TempDir()
	randomFile(t, filepath.Join(src, "a.bin"), 4<<20, 1)
	sock := filepath.Join(t.TempDir(), "lease.sock")
	args := []string{"mount", "--set", "log.format=console", "--set", "ipc.socket=" + sock,
		"--set", "staging.racy_window=0s"}
	mgr := newManager(t)
	m := mgr.mount(t, src, mnt, sock, append(args, src, mnt)...)
	t.Cleanup(func() { m.stop() }) // the daemon serving last
	leaseSum(t, m.path("a.bin"))
	mgr.waitStatus(t, "1 files")
	m.cmd.Process.Signal(syscall.SIGKILL)
	<-m.exited
	m = mgr.mount(t, src, mnt, sock, append(args, "--set", "fuse.max_read=256KiB", src, mnt)...)
	if !m.log.waitFor("descriptor store not used") {
		t.Fatalf("the restart with another fuse.max_read used the store:\n%s", m.log)
	}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", m.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, fd := range fds {
		link, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", m.cmd.Process.Pid, fd.Name()))
		if strings.HasPrefix(link, "/memfd:gdsfs-") && !strings.HasPrefix(link, "/memfd:gdsfs-state") && !strings.HasPrefix(link, "/memfd:gdsfs-nodes") {
			t.Errorf("descriptor %s of the restarted daemon is a region it did not take over: %s", fd.Name(), link)
		}
	}
	if got := sha(t, m.path("a.bin")); got != sha(t, filepath.Join(src, "a.bin")) {
		t.Fatal("a.bin after the fresh mount: wrong bytes")
	}
}

// TestCrashStoreRefusedLeavesOtherMountsAlone: a store the restart
// cannot use ends the FUSE connection it holds by closing it, not by
// aborting whatever is mounted where its state says: a mount made there
// since (the dead one detached) serves on.
func TestCrashStoreRefusedLeavesOtherMountsAlone(t *testing.T) {
	needMount(t)
	src, mnt := t.TempDir(), t.TempDir()
	randomFile(t, filepath.Join(src, "a.bin"), 4<<20, 1)
	sock := filepath.Join(t.TempDir(), "lease.sock")
	args := []string{"mount", "--set", "log.format=console", "--set", "ipc.socket=" + sock}
	mgr := newManager(t)
	first := mgr.mount(t, src, mnt, sock, append(args, src, mnt)...)
	leaseSum(t, first.path("a.bin"))
	mgr.waitStatus(t, "1 files")
	first.cmd.Process.Signal(syscall.SIGKILL)
	<-first.exited
	if err := unix.Unmount(mnt, unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	other := startMountAt(t, src, mnt)
	want := sha(t, filepath.Join(src, "a.bin"))
	if got := sha(t, other.path("a.bin")); got != want {
		t.Fatal("a.bin through the mount made after the crash: wrong bytes")
	}
	// Restarted on another mount point: the store is refused.
	elsewhere := t.TempDir()
	moved := mgr.mount(t, src, elsewhere, sock, append(args, src, elsewhere)...)
	t.Cleanup(moved.stop)
	if !moved.log.waitFor("descriptor store not used") {
		t.Fatalf("the restart on another mount point used the store:\n%s", moved.log)
	}
	if got := sha(t, other.path("a.bin")); got != want {
		t.Fatal("a.bin through the other mount after the store was refused: wrong bytes")
	}
}

// newestState is the JSON of the newest whole state the store holds
// (the daemon's two state memfds: magic, sequence, length, SHA-256, the
// JSON); "" when neither is whole.
func (m *manager) newestState() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var best string
	var bestSeq uint64
	for _, s := range m.store {
		if s.name != "gdsfs-state-a" && s.name != "gdsfs-state-b" {
			continue
		}
		b, err := io.ReadAll(io.NewSectionReader(s.f, 0, 1<<30))
		const header = 8 + 8 + 8 + sha256.Size
		if err != nil || len(b) < header || string(b[:8]) != "GDSFSST1" {
			continue
		}
		seq, n := binary.LittleEndian.Uint64(b[8:16]), binary.LittleEndian.Uint64(b[16:24])
		body := b[header:]
		if uint64(len(body)) != n || sha256.Sum256(body) != [sha256.Size]byte(b[24:header]) {
			continue
		}
		if seq > bestSeq {
			best, bestSeq = string(body), seq
		}
	}
	return best
}

// waitState waits until the newest whole state in the store holds want:
// a state is written before the STATUS= line that follows it.
func (m *manager) waitState(t *testing.T, want string) {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for !strings.Contains(m.newestState(), want) {
		select {
		case <-m.status:
		case <-timeout:
			t.Fatalf("no state holding %q in the store within 30s; the newest: %.300s", want, m.newestState())
		}
	}
}

// TestRestartSignalBeyondStoreMaxStops: a restart that needs more
// descriptors than the store takes ($FDSTORE) is not kept in part (the
// manager would close the rest unseen, and the restarted daemon find a
// store it cannot use and end the mount without a grace period): the
// daemon says so and stops as on SIGTERM, and the next start mounts
// afresh.
func TestRestartSignalBeyondStoreMaxStops(t *testing.T) {
	needMount(t)
	src, mnt := t.TempDir(), t.TempDir()
	randomFile(t, filepath.Join(src, "a.bin"), 1<<20, 1)
	sock := filepath.Join(t.TempDir(), "lease.sock")
	args := []string{"mount", "--set", "log.format=console", "--set", "ipc.socket=" + sock,
		"--set", "staging.racy_window=0s", src, mnt}
	t.Cleanup(func() { // a daemon that kept the mount in part left it
		if _, ok := mountinfo.MountedAt(mnt); ok {
			mountinfo.Unmount(mnt, true)
		}
	})
	mgr := newManager(t)
	mgr.mu.Lock()
	mgr.max = 6 // the two state memfds, the connection, the node journal, the lease socket, a.bin's region
	mgr.mu.Unlock()
	m := mgr.mount(t, src, mnt, sock, args...)
	t.Cleanup(m.stop)
	leaseSum(t, m.path("a.bin"))
	mgr.waitStatus(t, "1 files")
	if names := mgr.names(); len(names) != 6 {
		t.Fatalf("the store holds %q with a.bin resident; this test counts on 6 descriptors", names)
	}
	// Their connections are two more for the restart to keep: the keep
	// (which has no node journal: it keeps the whole tables) needs 7.
	h := hold(t, m.path("a.bin"))
	h2 := hold(t, m.path("a.bin"))
	m.cmd.Process.Signal(syscall.SIGUSR2)
	if err := m.exit(); err != nil {
		t.Fatalf("the daemon stopped for a restart: %v\n%s", err, m.log)
	}
	if strings.Contains(m.log.String(), "kept the mount") {
		t.Fatalf("the daemon says it kept the mount in a store too small for it:\n%s", m.log)
	}
	for _, want := range []string{"the store takes 6", "unmounted cleanly"} {
		if !strings.Contains(m.log.String(), want) {
			t.Errorf("the daemon's log does not say %q:\n%s", want, m.log)
		}
	}
	for _, h := range []*holder{h, h2} {
		h.cmd.Process.Kill()
		h.cmd.Wait()
	}
	next := mgr.mount(t, src, mnt, sock, args...)
	t.Cleanup(next.stop)
	if !next.log.waitFor("mounted") || strings.Contains(next.log.String(), "descriptor store") {
		t.Fatalf("the start after the stop did not mount afresh from an empty store:\n%s", next.log)
	}
	if got := sha(t, next.path("a.bin")); got != sha(t, filepath.Join(src, "a.bin")) {
		t.Fatal("a.bin after the fresh mount: wrong bytes")
	}
}

// TestRestartSignalUnconfirmedKeepsTheStoreCurrent: a keep the manager
// does not confirm (BARRIER=1 unanswered) leaves the daemon serving
// while it stops as on SIGTERM; the store then holds what a running
// daemon keeps there, not the keep's picture of the paused daemon (its
// open handles and leases, gone stale as it serves on), so that a crash
// during the grace period recovers as any crash does.
func TestRestartSignalUnconfirmedKeepsTheStoreCurrent(t *testing.T) {
	x := newManaged(t, "fuse.passthrough=off", "shutdown.grace=1h")
	// A file open through the mount holds the stop in its grace period.
	blocker := exec.Command("sh", "-c", `exec 3<"$1"; echo open; read x`, "sh", x.m.path(x.names[2]))
	blockerIn, _ := blocker.StdinPipe()
	blockerOut, _ := blocker.StdoutPipe()
	if err := blocker.Start(); err != nil {
		t.Fatal(err)
	}
	stopBlocker := func() { blockerIn.Close(); blocker.Process.Kill(); blocker.Wait() }
	if line, err := bufio.NewReader(blockerOut).ReadString('\n'); err != nil || line != "open\n" {
		stopBlocker()
		t.Fatalf("opening %s through the mount: %q %v", x.names[2], line, err)
	}
	first, killed := x.m, false
	t.Cleanup(func() {
		if !killed { // failed before: a second signal ends its grace period
			first.cmd.Process.Signal(syscall.SIGTERM)
			first.exit()
			stopBlocker()
		}
	})
	x.mgr.mu.Lock()
	x.mgr.holdBarrier = true
	x.mgr.mu.Unlock()
	x.m.cmd.Process.Signal(syscall.SIGUSR2)
	if !x.m.log.waitFor("stopping: new opens are refused") {
		stopBlocker()
		t.Fatalf("the daemon did not stop after a keep the manager did not confirm:\n%s", x.m.log)
	}
	if !strings.Contains(x.m.log.String(), "cannot keep the mount for the restart") {
		t.Errorf("the daemon's log does not say it could not keep the mount:\n%s", x.m.log)
	}
	// The keep names the cache's descriptors gdsfs-cache.N; a running
	// daemon's store names each region's.
	x.mgr.waitState(t, `"gdsfs-r`)
	x.m.cmd.Process.Signal(syscall.SIGKILL)
	<-x.m.exited
	killed = true
	x.mgr.mu.Lock()
	x.mgr.holdBarrier = false
	x.mgr.mu.Unlock()
	next := x.mgr.mount(t, x.src, x.mnt, x.m.sock, x.args...)
	t.Cleanup(next.stop)
	// Before next.stop, the files open through the mount are closed:
	// the blocker's, and the reader's, whose handle did not outlive the
	// crash (it reads on, fails and exits).
	defer func() {
		stopBlocker()
		io.WriteString(x.readerIn, "go\n")
		x.readerOut.ReadString('\n')
		x.reader.Wait() // its file closed: the mount is not busy
	}()
	if !next.log.waitFor("recovered the mount") {
		t.Fatalf("the daemon after the crash did not recover from the store:\n%s", next.log)
	}
	after := statsOf(t, next)
	if got := after["staged_files"].(float64); got != float64(x.files+1) {
		t.Errorf("staged_files %v after the crash, want %d", got, x.files+1)
	}
	for _, key := range []string{"open_files", "leases_active"} {
		if got := after[key].(float64); got != 0 {
			t.Errorf("%s %v after the crash: a crash keeps neither handles nor leases", key, got)
		}
	}
	if res := leaseSum(t, next.path(x.names[3])); res["sha256"] != sha(t, filepath.Join(x.src, x.names[3])) {
		t.Errorf("%s leased after the crash: wrong bytes", x.names[3])
	}
	x.h.cmd.Process.Kill() // its connection ended with the first daemon
	x.h.cmd.Wait()
}

// TestCrashStoreFullKeepsWhatFits: a resident file whose region does not
// fit in the store beside what it holds ($FDSTORE; the manager would
// close it unseen) is left out of the store, with a log line: a crash
// drops that file alone, and the restart recovers the rest instead of
// refusing a store that lacks a descriptor its state names.
func TestCrashStoreFullKeepsWhatFits(t *testing.T) {
	needMount(t)
	src, mnt := t.TempDir(), t.TempDir()
	randomFile(t, filepath.Join(src, "a.bin"), 1<<20, 1)
	randomFile(t, filepath.Join(src, "b.bin"), 1<<20, 2)
	sock := filepath.Join(t.TempDir(), "lease.sock")
	args := []string{"mount", "--set", "log.format=console", "--set", "ipc.socket=" + sock,
		"--set", "staging.racy_window=0s", src, mnt}
	mgr := newManager(t)
	mgr.mu.Lock()
	mgr.max = 6 // the two state memfds, the connection, the node journal, the lease socket, one region
	mgr.mu.Unlock()
	m := mgr.mount(t, src, mnt, sock, args...)
	leaseSum(t, m.path("a.bin"))
	mgr.waitStatus(t, "1 files")
	leaseSum(t, m.path("b.bin"))
	if !m.log.waitFor("descriptor store full") {
		m.stop()
		t.Fatalf("the daemon does not say b.bin's region has no room in the store:\n%s", m.log)
	}
	if got := statsOf(t, m)["staged_files"].(float64); got != 2 {
		m.stop()
		t.Fatalf("staged_files %v, want a.bin and b.bin", got)
	}
	m.cmd.Process.Signal(syscall.SIGKILL)
	<-m.exited
	next := mgr.mount(t, src, mnt, sock, args...)
	t.Cleanup(next.stop)
	if !next.log.waitFor("recovered the mount") {
		t.Fatalf("the restart did not recover from the full store:\n%s", next.log)
	}
	if got := statsOf(t, next)["staged_files"].(float64); got != 1 {
		t.Errorf("staged_files %v after the crash, want a.bin's 1\n%s", got, next.log)
	}
	for _, n := range []string{"a.bin", "b.bin"} {
		if got := sha(t, next.path(n)); got != sha(t, filepath.Join(src, n)) {
			t.Errorf("%s after the crash: wrong bytes", n)
		}
	}
}

// TestCrashHoldsBackTheDeadDaemonsHandles: after a crash, the kernel
// still names the files opened before it by the dead daemon's handle
// numbers. A file opened after the recovery must not get one of them:
// else closing the old descriptor (RELEASE of that number) would end the
// new one's handle, and its reads (served by the daemon: no passthrough)
// would fail. So after a second crash, with the first daemon's numbers
// still held.
func TestCrashHoldsBackTheDeadDaemonsHandles(t *testing.T) {
	for _, crashes := range []int{1, 2} {
		t.Run(fmt.Sprintf("crashes=%d", crashes), func(t *testing.T) { crashHoldsBackHandles(t, crashes) })
	}
}

func crashHoldsBackHandles(t *testing.T, crashes int) {
	needMount(t)
	need(t, "sh", "dd", "sha256sum")
	src, mnt := t.TempDir(), t.TempDir()
	randomFile(t, filepath.Join(src, "a.bin"), 4<<20, 1)
	randomFile(t, filepath.Join(src, "b.bin"), 1<<20, 2)
	want := sha(t, filepath.Join(src, "a.bin"))
	sock := filepath.Join(t.TempDir(), "lease.sock")
	args := []string{"mount", "--set", "log.format=console", "--set", "ipc.socket=" + sock,
		"--set", "fuse.passthrough=off", "--set", "staging.racy_window=0s", src, mnt}
	mgr := newManager(t)
	m := mgr.mount(t, src, mnt, sock, args...)
	// A shell holding a file of the mount open, told by lines on stdin
	// when to read or close it; it answers each with a line.
	type opener struct {
		in  io.Writer
		out *bufio.Reader
	}
	var serving *mount
	// readLine is the opener's next line; a guard (not a timing assumption)
	// turns a stall into a failure with the serving daemon's stacks.
	readLine := func(o opener) (string, error) { return lineOrStacks(t, o.out, serving) }
	open := func(script string) opener {
		c := exec.Command("sh", "-c", script, "sh", m.path("a.bin"))
		in, _ := c.StdinPipe()
		out, _ := c.StdoutPipe()
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Process.Kill(); c.Wait() })
		o := opener{in, bufio.NewReader(out)}
		if line, err := readLine(o); err != nil || line != "open\n" {
			t.Fatalf("opening a.bin through the mount: %q %v", line, err)
		}
		return o
	}
	serving = m
	before := open(`exec 3<"$1"; echo open; read go; exec 3<&-; echo closed`)
	next := m
	for i := range crashes {
		// The store holds this daemon's state once its STATUS= says so:
		// each daemon stages one more file, so the line is its own.
		leaseSum(t, next.path([]string{"a.bin", "b.bin"}[i]))
		mgr.waitStatus(t, fmt.Sprintf("%d files", i+1))
		next.cmd.Process.Signal(syscall.SIGKILL)
		<-next.exited
		next = mgr.mount(t, src, mnt, sock, args...)
		t.Cleanup(next.stop)
		if !next.log.waitFor("recovered the mount") {
			t.Fatalf("the daemon after the crash did not recover from the store:\n%s", next.log)
		}
		serving = next
	}
	after := open(`exec 4<"$1"; echo open; read go; dd bs=1M iflag=fullblock status=none <&4 | sha256sum`)
	io.WriteString(before.in, "go\n")
	if line, err := readLine(before); err != nil || line != "closed\n" {
		t.Fatalf("closing the descriptor opened before the crash: %q %v", line, err)
	}
	io.WriteString(after.in, "go\n")
	if line, err := readLine(after); err != nil || line != want+"  -\n" {
		t.Fatalf("reading a.bin through the descriptor opened after the crash, once the one opened before it was closed: %q %v, want %s\n%s", line, err, want, next.log)
	}
}
