package fs

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/hanwen/go-fuse/v2/fuse"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/internal/units"
	"github.com/gdsfs/gdsfs/staging/watch"
)

func handoverConfig(src, mnt string) Config {
	return handoverConfigWith(src, mnt, PassthroughOff)
}

func handoverConfigWith(src, mnt, passthrough string) Config {
	return Config{Source: src, Mountpoint: mnt, Options: Options{
		Passthrough: passthrough, MaxRead: units.Size(1 << 20), EntryTimeout: time.Hour, AttrTimeout: time.Hour,
	}}
}

// openFds lists this process's descriptors.
func openFds(t *testing.T) []string {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	var fds []string
	for _, e := range ents {
		if l, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil {
			fds = append(fds, e.Name()+" "+l)
		}
	}
	return fds
}

// fdsSubset reports whether every descriptor of after (number and file)
// was open before: one an earlier test left to a finalizer may close in
// between, which is no leak of this test's.
func fdsSubset(after, before []string) bool {
	for _, fd := range after {
		if !slices.Contains(before, fd) {
			return false
		}
	}
	return true
}

// handoverSetup mounts A over a SOURCE with a nested file.
func handoverSetup(t *testing.T) (src, mnt string, a *Server) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("SKIPPED: mounting FUSE needs root (run make test as root)")
	}
	src, mnt = t.TempDir(), t.TempDir()
	if err := os.MkdirAll(filepath.Join(src, "d/e"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string]string{"d/e/f.bin": "hello, world", "d/g": "g", "top": "top"} {
		if err := os.WriteFile(filepath.Join(src, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	a, err := Mount(handoverConfig(src, mnt))
	if err != nil {
		t.Fatal(err)
	}
	return src, mnt, a
}

// waitReleased waits until the server holds no file handle (the kernel
// releases a closed file after close returns).
func waitReleased(t *testing.T, s *Server) { waitHandles(t, s, 0) }

// waitHandles waits until the server holds n file handles. A hand-over
// does not wait for the releases the kernel has queued (the successor
// serves them), so the tests that count a server's handles let them
// arrive first.
func waitHandles(t *testing.T, s *Server, n int) {
	t.Helper()
	r := &s.raw.refs
	late := false
	timer := time.AfterFunc(10*time.Second, func() {
		r.mu.Lock()
		late = true
		r.cond.Broadcast()
		r.mu.Unlock()
	})
	defer timer.Stop()
	r.mu.Lock()
	defer r.mu.Unlock()
	for len(r.fhs) != n && !late {
		r.cond.Wait()
	}
	if len(r.fhs) != n {
		t.Fatalf("handles never released: %v (nodes %v)", r.fhs, r.nodes)
	}
}

// TestHandoverKeepsTheMount: a second server adopts the connection; a
// file and a directory opened before read right after, cached paths and
// new opens work, and the successor unmounts cleanly with nothing left.
func TestHandoverKeepsTheMount(t *testing.T) {
	for _, mode := range []string{PassthroughOff, PassthroughAuto} {
		t.Run("passthrough "+mode, func(t *testing.T) { testHandoverKeepsTheMount(t, mode) })
	}
}

func testHandoverKeepsTheMount(t *testing.T, passthrough string) {
	src, mnt, a := handoverSetup(t)
	// go-fuse keeps process-wide descriptors (splice pipes) once a mount
	// served: the baseline is taken after one did.
	if _, err := os.ReadFile(filepath.Join(mnt, "top")); err != nil {
		t.Fatal(err)
	}
	waitReleased(t, a)
	if err := a.Unmount(); err != nil {
		t.Fatal(err)
	}
	a.Wait()
	fdsBefore := openFds(t)
	cfg := handoverConfigWith(src, mnt, passthrough)
	a, err := Mount(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var b *Server
	t.Cleanup(func() {
		if b == nil {
			a.Unmount()
			a.Wait()
		}
	})
	f, err := os.Open(filepath.Join(mnt, "d/e/f.bin"))
	if err != nil {
		t.Fatal(err)
	}
	head := make([]byte, 5)
	if _, err := io.ReadFull(f, head); err != nil || string(head) != "hello" {
		t.Fatalf("read before: %q %v", head, err)
	}
	if _, err := os.Stat(filepath.Join(mnt, "d/e/f.bin")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.ReadDir(filepath.Join(mnt, "d")); err != nil {
		t.Fatal(err)
	}
	dir, err := os.Open(filepath.Join(mnt, "d"))
	if err != nil {
		t.Fatal(err)
	}
	waitHandles(t, a, 2)

	st, files, err := a.Handoff()
	if err != nil {
		t.Fatal(err)
	}
	// A request made during the switch waits for the successor (the
	// predecessor's readers no longer read the connection).
	during := make(chan error, 1)
	go func() {
		_, err := os.ReadFile(filepath.Join(mnt, "d/g"))
		during <- err
	}()
	raw, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	var st2 FUSEState
	if err := json.Unmarshal(raw, &st2); err != nil {
		t.Fatal(err)
	}
	b, err = Adopt(cfg, st2, files)
	for _, f := range files {
		f.Close()
	}
	if err != nil {
		a.Resume()
		t.Fatal(err)
	}
	a.Abandon()
	if err := b.Serve(); err != nil {
		t.Fatal(err)
	}
	if err := <-during; err != nil {
		t.Errorf("a read during the switch: %v", err)
	}

	rest, err := io.ReadAll(f)
	if err != nil || string(rest) != ", world" {
		t.Errorf("read after: %q %v", rest, err)
	}
	if names, err := dir.Readdirnames(-1); err != nil || !slices.Contains(names, "e") || !slices.Contains(names, "g") {
		t.Errorf("listing after: %q %v", names, err)
	}
	if fi, err := os.Stat(filepath.Join(mnt, "d/e/f.bin")); err != nil || fi.Size() != 12 {
		t.Errorf("stat after: %v %v", fi, err)
	}
	if data, err := os.ReadFile(filepath.Join(mnt, "d/e/f.bin")); err != nil || string(data) != "hello, world" {
		t.Errorf("open after: %q %v", data, err)
	}
	if data, err := os.ReadFile(filepath.Join(mnt, "top")); err != nil || string(data) != "top" {
		t.Errorf("a file not looked up before: %q %v", data, err)
	}
	if err := os.WriteFile(filepath.Join(mnt, "d/new"), []byte("new"), 0o644); err != nil {
		t.Errorf("create after: %v", err)
	} else if data, err := os.ReadFile(filepath.Join(src, "d/new")); err != nil || string(data) != "new" {
		t.Errorf("created file in SOURCE: %q %v", data, err)
	}
	f.Close()
	dir.Close()
	waitReleased(t, b)
	t.Logf("passthrough: %v %s", b.Stats().Passthrough, b.Stats().PassthroughWhy)
	if err := b.Unmount(); err != nil {
		t.Fatal(err)
	}
	b.Wait()
	if fds := openFds(t); !fdsSubset(fds, fdsBefore) {
		t.Errorf("descriptors left: before %q, after %q", fdsBefore, fds)
	}
	buf := make([]byte, 1<<20)
	if stacks := string(buf[:runtime.Stack(buf, true)]); strings.Contains(stacks, "fs.forward") {
		t.Errorf("forwarding goroutine left:\n%s", stacks)
	}
}

// TestHandoverResendsWhatThePredecessorRead: a request the predecessor
// read from the connection in the instant it let go, and never answered
// (here the test reads it in its place), is answered by the successor:
// the kernel resends it. Without, the caller waits until the mount ends.
func TestHandoverResendsWhatThePredecessorRead(t *testing.T) {
	src, mnt, a := handoverSetup(t)
	cfg := handoverConfig(src, mnt)
	st, files, err := a.Handoff()
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		data, err := os.ReadFile(filepath.Join(mnt, "top"))
		if err == nil && string(data) != "top" {
			err = fmt.Errorf("read %q", data)
		}
		got <- err
	}()
	// The kernel's requests up to its LOOKUP of "top", read as a
	// predecessor's reader would and left unanswered.
	read := readUntilLookup(t, st, files, mnt, "top")
	b := adoptFrom(t, a, cfg, st, files)
	unmountAtEnd(t, b)
	// A guard, not a timing: the lookup is answered at once or never.
	guard := time.NewTimer(time.Minute)
	defer guard.Stop()
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("read through the requests the predecessor read (%q): %v", read, err)
		}
	case <-guard.C:
		abortConnection(t, st.MountDev, mnt)
		t.Fatalf("the requests the predecessor read and did not answer (%q) were never answered: the successor did not have the kernel resend them", read)
	}
	waitReleased(t, b)
}

// readUntilLookup reads the kernel's requests from the connection of st
// (a hand-over's, among files) up to its LOOKUP of name, and leaves them
// unanswered, as a predecessor's reader may; it returns what it read.
// The test fails, the mount at mnt aborted, when no such LOOKUP comes
// among the first 64.
func readUntilLookup(t *testing.T, st FUSEState, files []*os.File, mnt, name string) []string {
	t.Helper()
	const lookup = 1
	buf := make([]byte, 4<<20)
	var read []string
	for len(read) < 64 {
		n, err := syscall.Read(int(files[st.FUSE].Fd()), buf)
		var in fuse.InHeader
		if err != nil || n < int(unsafe.Sizeof(in)) {
			abortConnection(t, st.MountDev, mnt)
			t.Fatalf("reading the kernel's requests: %d bytes, %v", n, err)
		}
		in = *(*fuse.InHeader)(unsafe.Pointer(&buf[0]))
		arg := strings.TrimRight(string(buf[unsafe.Sizeof(in):n]), "\x00")
		read = append(read, fmt.Sprintf("opcode %d %q", in.Opcode, arg))
		if in.Opcode == lookup && arg == name {
			return read
		}
	}
	abortConnection(t, st.MountDev, mnt)
	t.Fatalf("no LOOKUP of %s among the kernel's requests: %q", name, read)
	return nil
}

// abortConnection aborts the FUSE connection of the mount at mnt, with
// device number dev (its waiting callers fail with ENOTCONN), and
// detaches the mount.
func abortConnection(t *testing.T, dev uint64, mnt string) {
	t.Helper()
	p := fmt.Sprintf("/sys/fs/fuse/connections/%d/abort", unix.Minor(dev))
	if err := os.WriteFile(p, []byte("1"), 0); err != nil {
		t.Errorf("aborting the connection: %v", err)
	}
	if err := unix.Unmount(mnt, unix.MNT_DETACH); err != nil {
		t.Errorf("detaching %s: %v", mnt, err)
	}
}

// TestHandoverResume: after Handoff and Resume the server serves again,
// the file opened before included.
func TestHandoverResume(t *testing.T) {
	_, mnt, a := handoverSetup(t)
	t.Cleanup(func() {
		if err := a.Unmount(); err != nil {
			t.Error(err)
		}
		a.Wait()
	})
	f, err := os.Open(filepath.Join(mnt, "d/e/f.bin"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	waitHandles(t, a, 1)
	_, files, err := a.Handoff()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		f.Close()
	}
	if err := a.Resume(); err != nil {
		t.Fatal(err)
	}
	if data, err := io.ReadAll(f); err != nil || string(data) != "hello, world" {
		t.Errorf("read after resume: %q %v", data, err)
	}
	if data, err := os.ReadFile(filepath.Join(mnt, "d/g")); err != nil || string(data) != "g" {
		t.Errorf("open after resume: %q %v", data, err)
	}
	f.Close()
	waitReleased(t, a)
}

// TestHandoverForget: the kernel forgets an adopted node (its entry
// dropped) without the successor panicking, and its lookup count goes
// to zero.
func TestHandoverForget(t *testing.T) {
	src, mnt, a := handoverSetup(t)
	if _, err := os.Stat(filepath.Join(mnt, "d/e/f.bin")); err != nil {
		t.Fatal(err)
	}
	st, files, err := a.Handoff()
	if err != nil {
		t.Fatal(err)
	}
	b, err := Adopt(handoverConfig(src, mnt), st, files)
	for _, f := range files {
		f.Close()
	}
	if err != nil {
		a.Resume()
		a.Unmount()
		a.Wait()
		t.Fatal(err)
	}
	a.Abandon()
	if err := b.Serve(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.Unmount(); err != nil {
			t.Error(err)
		}
		b.Wait()
	})
	var fi syscall.Stat_t
	if err := syscall.Stat(filepath.Join(src, "d/e/f.bin"), &fi); err != nil {
		t.Fatal(err)
	}
	e := b.tree.EmbeddedInode().GetChild("d").GetChild("e")
	if e == nil {
		t.Fatal("d/e is not in the adopted tree")
	}
	if errno := e.NotifyEntry("f.bin"); errno != 0 {
		t.Fatalf("invalidating d/e/f.bin: %v", errno)
	}
	r := &b.raw.refs
	r.mu.Lock()
	for r.nodes[fi.Ino] > 0 {
		r.cond.Wait()
	}
	r.mu.Unlock()
	if data, err := os.ReadFile(filepath.Join(mnt, "d/e/f.bin")); err != nil || string(data) != "hello, world" {
		t.Errorf("looked up again: %q %v", data, err)
	}
}

// TestUnknownNodeID: a request naming a node id or handle the daemon
// never gave answers an error; a FORGET of one is ignored.
func TestUnknownNodeID(t *testing.T) {
	src, mnt := t.TempDir(), t.TempDir()
	if os.Geteuid() != 0 {
		t.Skip("SKIPPED: mounting FUSE needs root (run make test as root)")
	}
	s, err := Mount(handoverConfig(src, mnt))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Unmount(); err != nil {
			t.Error(err)
		}
		s.Wait()
	})
	const unknown = 987654321
	var out fuse.AttrOut
	if code := s.raw.GetAttr(nil, &fuse.GetAttrIn{InHeader: fuse.InHeader{NodeId: unknown}}, &out); code != fuse.Status(syscall.ESTALE) {
		t.Errorf("GETATTR of an unknown node: %v", code)
	}
	if _, code := s.raw.Read(nil, &fuse.ReadIn{InHeader: fuse.InHeader{NodeId: 1}, Fh: 77}, make([]byte, 10)); code != fuse.Status(syscall.EBADF) {
		t.Errorf("READ of an unknown handle: %v", code)
	}
	s.raw.Forget(unknown, 1)
	s.raw.Forget(1, 1)
	if _, err := os.Stat(mnt); err != nil {
		t.Errorf("the mount after: %v", err)
	}
}

// TestHandoverMetaInvalidation: a successor invalidates what the kernel
// cached for long of the nodes it adopted, on SOURCE's change events.
func TestHandoverMetaInvalidation(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("SKIPPED: mounting FUSE and fanotify need root (run make test as root)")
	}
	src, mnt := t.TempDir(), t.TempDir()
	s, m := func(p string) string { return filepath.Join(src, p) }, func(p string) string { return filepath.Join(mnt, p) }
	os.Mkdir(s("d"), 0o755)
	os.WriteFile(s("d/a"), []byte("a"), 0o644)
	cfg := handoverConfig(src, mnt)
	w1 := watch.New(watch.Auto, nil)
	t.Cleanup(w1.Close)
	cfg.Watch = w1
	a, err := Mount(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !a.meta.on {
		a.Unmount()
		a.Wait()
		t.Fatalf("no entry events on %s: %s", src, a.meta.why)
	}
	if _, err := os.ReadDir(m("d")); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(m("d/a")); err != nil || fi.Mode().Perm() != 0o644 {
		t.Fatalf("d/a before: %v %v", fi, err)
	}
	st, files, err := a.Handoff()
	if err != nil {
		t.Fatal(err)
	}
	w2 := watch.New(watch.Auto, nil)
	t.Cleanup(w2.Close)
	cfg.Watch = w2
	b := adoptFrom(t, a, cfg, st, files)
	unmountAtEnd(t, b)
	if err := os.Chmod(s("d/a"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(s("d/c"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	b.settle(w2)
	if fi, err := os.Lstat(m("d/a")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("d/a after a chmod in SOURCE: %v %v", fi, err)
	}
	names, err := os.ReadDir(m("d"))
	if err != nil || !slices.ContainsFunc(names, func(e os.DirEntry) bool { return e.Name() == "c" }) {
		t.Errorf("d after a create in SOURCE: %v %v", names, err)
	}
}

// handOver moves the mount from a to a new server through a JSON
// round-trip of the state.
func handOver(t *testing.T, a *Server, cfg Config) *Server {
	t.Helper()
	st, files, err := a.Handoff()
	if err != nil {
		t.Fatal(err)
	}
	raw, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	var st2 FUSEState
	if err := json.Unmarshal(raw, &st2); err != nil {
		t.Fatal(err)
	}
	return adoptFrom(t, a, cfg, st2, files)
}

// adoptFrom has a successor adopt st and files (closed here) from a,
// which lets go, and serve; a serves on if the successor refuses.
func adoptFrom(t *testing.T, a *Server, cfg Config, st FUSEState, files []*os.File) *Server {
	t.Helper()
	b, err := Adopt(cfg, st, files)
	for _, f := range files {
		f.Close()
	}
	if err != nil {
		a.Resume()
		a.Unmount()
		a.Wait()
		t.Fatal(err)
	}
	a.Abandon()
	if err := b.Serve(); err != nil {
		t.Fatal(err)
	}
	return b
}

// unmountAtEnd unmounts s when the test ends.
func unmountAtEnd(t *testing.T, s *Server) {
	t.Cleanup(func() {
		if err := s.Unmount(); err != nil {
			t.Error(err)
		}
		s.Wait()
	})
}

// TestHandoverTwice: a successor hands the mount on in turn; a file
// opened under the first server reads on under the third.
func TestHandoverTwice(t *testing.T) {
	src, mnt, a := handoverSetup(t)
	cfg := handoverConfig(src, mnt)
	f, err := os.Open(filepath.Join(mnt, "d/e/f.bin"))
	if err != nil {
		a.Unmount()
		a.Wait()
		t.Fatal(err)
	}
	defer f.Close()
	head := make([]byte, 5)
	if _, err := io.ReadFull(f, head); err != nil {
		t.Fatal(err)
	}
	waitHandles(t, a, 1)
	b := handOver(t, a, cfg)
	if data, err := os.ReadFile(filepath.Join(mnt, "d/g")); err != nil || string(data) != "g" {
		t.Errorf("open under the second: %q %v", data, err)
	}
	waitHandles(t, b, 1)
	c := handOver(t, b, cfg)
	t.Cleanup(func() {
		if err := c.Unmount(); err != nil {
			t.Error(err)
		}
		c.Wait()
	})
	if rest, err := io.ReadAll(f); err != nil || string(rest) != ", world" {
		t.Errorf("read under the third: %q %v", rest, err)
	}
	if data, err := os.ReadFile(filepath.Join(mnt, "d/g")); err != nil || string(data) != "g" {
		t.Errorf("open under the third: %q %v", data, err)
	}
	f.Close()
	waitReleased(t, c)
}

// TestAdoptRefusesOtherVersionsAndOptions: a state of another version,
// or options the connection was not set up with, are refused before
// anything is served.
func TestAdoptRefusesOtherVersionsAndOptions(t *testing.T) {
	src, mnt := t.TempDir(), t.TempDir()
	for _, v := range []int{0, FUSEStateVersion + 1} {
		st := FUSEState{Version: v}
		want := fmt.Sprintf("state version %d, this daemon reads versions 1 to %d", v, FUSEStateVersion)
		if _, err := Adopt(handoverConfig(src, mnt), st, nil); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("version %d: %v, want %q", v, err, want)
		}
	}
	st := FUSEState{Version: FUSEStateVersion, MaxRead: 128 << 10, Passthrough: PassthroughOff}
	if _, err := Adopt(handoverConfig(src, mnt), st, nil); err == nil || !strings.Contains(err.Error(), "fuse.max_read") {
		t.Errorf("another max_read: %v", err)
	}
}

// TestAdoptBareConnection: a successor with the connection and no
// tables (what a daemon killed with SIGKILL leaves in the service
// manager's fd store) serves the paths the kernel cached: node ids do
// not depend on the daemon, and the kernel looks its entries up again.
func TestAdoptBareConnection(t *testing.T) {
	src, mnt, a := handoverSetup(t)
	cfg := handoverConfig(src, mnt)
	if _, err := os.Stat(filepath.Join(mnt, "d/e/f.bin")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.ReadDir(filepath.Join(mnt, "d")); err != nil {
		t.Fatal(err)
	}
	waitHandles(t, a, 0)
	bare, bareFiles, err := a.ConnectionState()
	if err != nil {
		t.Fatal(err)
	}
	// The predecessor stops as if killed: its tables are not used.
	_, files, err := a.Handoff()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		f.Close()
	}
	core, logs := observer.New(zap.WarnLevel)
	cfg.Log = zap.New(core)
	b := adoptFrom(t, a, cfg, bare, bareFiles)
	unmountAtEnd(t, b)
	for _, e := range logs.All() {
		t.Errorf("adopting a bare connection: %s %v", e.Message, e.Context)
	}
	if fi, err := os.Stat(filepath.Join(mnt, "d/e/f.bin")); err != nil || fi.Size() != 12 {
		t.Errorf("stat of a cached path: %v %v", fi, err)
	}
	if data, err := os.ReadFile(filepath.Join(mnt, "d/e/f.bin")); err != nil || string(data) != "hello, world" {
		t.Errorf("open of a cached path: %q %v", data, err)
	}
	if names, err := os.ReadDir(filepath.Join(mnt, "d")); err != nil || len(names) != 2 {
		t.Errorf("listing of a cached directory: %v %v", names, err)
	}
	waitReleased(t, b)
}

// TestAdoptServesNothingBeforeServe: an adopted server reads nothing
// from the connection until Serve, so its predecessor can serve on; let
// go unserved (the predecessor kept the mount), it leaves the connection,
// the handles and their passthrough backing ids to the predecessor and
// holds no descriptor.
func TestAdoptServesNothingBeforeServe(t *testing.T) {
	src, mnt, a := handoverSetup(t)
	if err := a.Unmount(); err != nil {
		t.Fatal(err)
	}
	a.Wait()
	cfg := handoverConfigWith(src, mnt, PassthroughAuto)
	a, err := Mount(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := a.Unmount(); err != nil {
			t.Error(err)
		}
		a.Wait()
	})
	if _, err := os.ReadFile(filepath.Join(mnt, "top")); err != nil {
		t.Fatal(err)
	}
	waitReleased(t, a)
	fdsBefore := openFds(t)
	f, err := os.Open(filepath.Join(mnt, "d/e/f.bin"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	head := make([]byte, 5)
	if _, err := io.ReadFull(f, head); err != nil || string(head) != "hello" {
		t.Fatalf("read before: %q %v", head, err)
	}
	waitHandles(t, a, 1)
	st, files, err := a.Handoff()
	if err != nil {
		t.Fatal(err)
	}
	b, err := Adopt(cfg, st, files)
	for _, f := range files {
		f.Close()
	}
	if err != nil {
		a.Resume()
		t.Fatal(err)
	}
	if l, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", b.fuseFd)); err != nil || l == "/dev/fuse" {
		a.Resume()
		b.Abandon()
		t.Fatalf("the adopted server's descriptor names %q (%v) before Serve: it reads the connection", l, err)
	}
	during := make(chan error, 1)
	go func() {
		data, err := os.ReadFile(filepath.Join(mnt, "d/g"))
		if err == nil && string(data) != "g" {
			err = fmt.Errorf("read %q", data)
		}
		during <- err
	}()
	if err := a.Resume(); err != nil {
		t.Fatal(err)
	}
	b.Abandon()
	if err := <-during; err != nil {
		t.Errorf("a read made while both held the connection: %v", err)
	}
	if got := b.Stats().Opens; got != 0 {
		t.Errorf("the server never served answered %d opens", got)
	}
	if rest, err := io.ReadAll(f); err != nil || string(rest) != ", world" {
		t.Errorf("read on through the file opened before: %q %v", rest, err)
	}
	if data, err := os.ReadFile(filepath.Join(mnt, "top")); err != nil || string(data) != "top" {
		t.Errorf("open after: %q %v", data, err)
	}
	f.Close()
	waitReleased(t, a)
	if fds := openFds(t); !fdsSubset(fds, fdsBefore) {
		t.Errorf("descriptors left: before %q, after %q", fdsBefore, fds)
	}
}

// TestHandoverWithAChangeInALockedDirectory: a change in SOURCE reported
// while a hand-over holds the requests back, about a directory whose
// lock a caller holds while its request waits, does not stop the
// hand-over: the predecessor tells the kernel nothing from the switch
// on (a notification would wait for that lock, and the predecessor for
// it), and the successor looks everything up again.
func TestHandoverWithAChangeInALockedDirectory(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("SKIPPED: mounting FUSE needs root (run make test as root)")
	}
	q := &quietWatcher{}
	src, mnt := t.TempDir(), t.TempDir()
	os.Mkdir(filepath.Join(src, "d"), 0o755)
	cfg := handoverConfig(src, mnt)
	cfg.Watch = q
	a, err := Mount(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(mnt, "d")); err != nil {
		t.Fatal(err)
	}
	dir := a.fidOf(t, filepath.Join(src, "d"))
	st, files, err := a.Handoff()
	if err != nil {
		t.Fatal(err)
	}
	looked := make(chan error, 1)
	go func() {
		_, err := os.Stat(filepath.Join(mnt, "d/new"))
		looked <- err
	}()
	// The caller's LOOKUP of d/new, read as a predecessor's reader would:
	// the caller holds d's lock until it is answered.
	readUntilLookup(t, st, files, mnt, "new")
	q.sub.Entries(watch.Change{Mask: unix.FAN_CREATE, Dir: dir, Name: "other"})
	a.settle(q)
	cfg.Watch = &quietWatcher{}
	b, err := Adopt(cfg, st, files)
	for _, f := range files {
		f.Close()
	}
	if err != nil {
		abortConnection(t, st.MountDev, mnt)
		t.Fatal(err)
	}
	abandoned := make(chan struct{})
	go func() {
		a.Abandon()
		close(abandoned)
	}()
	// A guard, not a timing: the predecessor lets go at once or never.
	guard := time.NewTimer(time.Minute)
	defer guard.Stop()
	select {
	case <-abandoned:
	case <-guard.C:
		abortConnection(t, st.MountDev, mnt)
		t.Fatal("the predecessor never let go: its notification of the change waited for the lock of d, held by a caller whose request waits for the successor")
	}
	if err := b.Serve(); err != nil {
		t.Fatal(err)
	}
	unmountAtEnd(t, b)
	if err := <-looked; !os.IsNotExist(err) {
		t.Errorf("stat of d/new across the hand-over: %v, want ENOENT", err)
	}
}
