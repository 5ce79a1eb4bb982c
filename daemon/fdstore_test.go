package daemon

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/daemon/handover"
)

func stateFile(t *testing.T) *os.File {
	t.Helper()
	fd, err := unix.MemfdCreate("state", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "state")
	t.Cleanup(func() { f.Close() })
	return f
}

// TestStoredStateSurvivesATornWrite: of the two state memfds, the newer
// whole one is read; one cut short (the daemon died writing it) is
// passed over for the older.
func TestStoredStateSurvivesATornWrite(t *testing.T) {
	s := &fdStore{states: [2]*os.File{stateFile(t), stateFile(t)}}
	for _, src := range []string{"/one", "/two", "/three"} {
		if err := s.write(storedState{Source: src}); err != nil {
			t.Fatal(err)
		}
	}
	got, err := readState(s.states[:])
	if err != nil || got.Source != "/three" {
		t.Fatalf("read %q, %v; want the last written", got.Source, err)
	}
	newest := s.states[s.seq%2]
	st, _ := newest.Stat()
	if err := newest.Truncate(st.Size() - 3); err != nil {
		t.Fatal(err)
	}
	got, err = readState(s.states[:])
	if err != nil || got.Source != "/two" {
		t.Fatalf("with the newest cut short read %q, %v; want the one before", got.Source, err)
	}
	s.states[(s.seq+1)%2].Truncate(10)
	if _, err := readState(s.states[:]); err == nil || !strings.Contains(err.Error(), "no whole state") {
		t.Fatalf("with both torn: %v", err)
	}
}

// TestFromStoreNamesEveryDescriptor: a part's descriptors come back by
// name, in order; a name the state lists and the store lacks fails, and
// what no state names is closed.
func TestFromStoreNamesEveryDescriptor(t *testing.T) {
	s := &fdStore{states: [2]*os.File{stateFile(t), stateFile(t)}}
	st := storedState{Protocol: handover.Protocol, Source: "/s", Parts: []handover.Part{{Name: partCache, State: []byte(`{}`), Files: 2}},
		Names: [][]string{{"gdsfs-r0.0", "gdsfs-r0.1"}}}
	if err := s.write(st); err != nil {
		t.Fatal(err)
	}
	a, b, stray := stateFile(t), stateFile(t), stateFile(t)
	passed := map[string]*os.File{storeStateA: s.states[0], storeStateB: s.states[1],
		"gdsfs-r0.1": b, "gdsfs-r0.0": a, "gdsfs-r9.0": stray}
	_, hs, files, err := fromStore(passed)
	if err != nil {
		t.Fatal(err)
	}
	if len(hs.Parts) != 1 || len(files[partCache]) != 2 || files[partCache][0] != a || files[partCache][1] != b {
		t.Fatalf("cache files %v, want r0.0 then r0.1", files[partCache])
	}
	if _, err := stray.Stat(); err == nil {
		t.Fatal("a descriptor no state names was left open")
	}
	delete(passed, "gdsfs-r0.1")
	if _, _, _, err := fromStore(passed); err == nil || !strings.Contains(err.Error(), "gdsfs-r0.1 is missing") {
		t.Fatalf("a state naming a missing descriptor: %v", err)
	}
	st.Parts = append(st.Parts, st.Parts[0])
	st.Names = append(st.Names, []string{"gdsfs-r9.0"})
	if err := s.write(st); err != nil {
		t.Fatal(err)
	}
	passed["gdsfs-r0.1"], passed["gdsfs-r9.0"] = stateFile(t), stateFile(t)
	if _, _, _, err := fromStore(passed); err == nil || !strings.Contains(err.Error(), "part cache stored twice") {
		t.Fatalf("a state naming a part twice: %v", err)
	}
}

// TestFromStoreRefusesAnotherProtocol: a state written by a daemon of
// another hand-over protocol (an upgrade by a unit's restart) is refused
// with both numbers, never decoded.
func TestFromStoreRefusesAnotherProtocol(t *testing.T) {
	s := &fdStore{states: [2]*os.File{stateFile(t), stateFile(t)}}
	if err := s.write(storedState{Protocol: handover.Protocol + 1, Source: "/s"}); err != nil {
		t.Fatal(err)
	}
	passed := map[string]*os.File{storeStateA: s.states[0], storeStateB: s.states[1]}
	_, _, _, err := fromStore(passed)
	want := fmt.Sprintf("hand-over protocol %d, this daemon speaks %d", handover.Protocol+1, handover.Protocol)
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("a state of another protocol: %v; want an error saying %q", err, want)
	}
}

// TestNamedFilesRefusesANameTwice: $LISTEN_FDNAMES naming two
// descriptors alike is an error naming it; the first is kept, the later
// one closed (not leaked), and a descriptor past the names is "unknown".
func TestNamedFilesRefusesANameTwice(t *testing.T) {
	var fds []int
	for range 3 {
		fd, err := unix.MemfdCreate("passed", unix.MFD_CLOEXEC)
		if err != nil {
			t.Fatal(err)
		}
		fds = append(fds, fd)
	}
	// The second gdsfs-fuse.0 is a pipe's only write end: once it is
	// closed, the read end reads end-of-file.
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(p[0])
	fds = slices.Insert(fds, 2, p[1])
	got, err := namedFiles(fds, []string{"gdsfs-fuse.0", "gdsfs-r0.0", "gdsfs-fuse.0"})
	for _, f := range got {
		defer f.Close()
	}
	if err == nil || !strings.Contains(err.Error(), "gdsfs-fuse.0 passed more than once") {
		t.Fatalf("a name passed twice: %v", err)
	}
	if got["gdsfs-fuse.0"] == nil || int(got["gdsfs-fuse.0"].Fd()) != fds[0] || got["unknown"] == nil || len(got) != 3 {
		t.Fatalf("named %v; want the first gdsfs-fuse.0, gdsfs-r0.0 and unknown", got)
	}
	if n, err := unix.Read(p[0], make([]byte, 1)); n != 0 || err != nil {
		t.Fatalf("the second gdsfs-fuse.0 is still open (read %d, %v): leaked", n, err)
	}
}

// TestStoredStateBounded: a state memfd larger than a hand-over message
// may be is refused from its size, never read.
func TestStoredStateBounded(t *testing.T) {
	f := stateFile(t)
	if err := f.Truncate(storeHeader + handover.MaxMessage + 1); err != nil {
		t.Fatal(err)
	}
	_, err := readState([]*os.File{f})
	want := fmt.Sprintf("a state of %d bytes, more than the %d", storeHeader+handover.MaxMessage+1, storeHeader+handover.MaxMessage)
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("an oversized state: %v; want an error saying %q", err, want)
	}
}

// TestKeepCutShortLeavesNoStateAndNamesAll: a keep that fails half-way
// (here on a descriptor it cannot send) leaves no whole state, so the
// next start adopts neither the earlier state, whose names the keep
// began to replace, nor part of the new one; and stop(true) removes
// every name the keep stored, those of the part it failed in included.
func TestKeepCutShortLeavesNoStateAndNamesAll(t *testing.T) {
	path := filepath.Join(t.TempDir(), "notify")
	l, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	t.Setenv("NOTIFY_SOCKET", path)
	t.Setenv("FDSTORE", "100")
	stored := map[string]bool{}
	read := make(chan struct{})
	go func() {
		defer close(read)
		buf, oob := make([]byte, 4096), make([]byte, unix.CmsgSpace(4*16))
		for {
			n, oobn, _, _, err := l.ReadMsgUnix(buf, oob)
			if err != nil {
				return
			}
			if msgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
				for _, m := range msgs {
					fds, _ := unix.ParseUnixRights(&m)
					for _, fd := range fds {
						unix.Close(fd)
					}
				}
			}
			fields := map[string]string{}
			for _, line := range strings.Split(string(buf[:n]), "\n") {
				k, v, _ := strings.Cut(line, "=")
				fields[k] = v
			}
			switch {
			case fields["FDSTORE"] == "1":
				stored[fields["FDNAME"]] = true
			case fields["FDSTOREREMOVE"] == "1":
				delete(stored, fields["FDNAME"])
			case fields["END"] == "1":
				return
			}
		}
	}()
	s := &fdStore{log: zap.NewNop(), states: [2]*os.File{stateFile(t), stateFile(t)}, done: make(chan struct{}),
		fixedN: [][]string{{storeFUSE + ".0"}, {storeIPC + ".0"}}, regions: map[string][]string{"a": {storeRegion + "0.0"}}}
	crash := storedState{Protocol: handover.Protocol, Source: "/s", Mountpoint: "/m",
		Parts: []handover.Part{{Name: partFS, State: []byte(`{}`), Files: 1}, {Name: partIPC, State: []byte(`{}`), Files: 1},
			{Name: partCache, State: []byte(`{}`), Files: 1}},
		Names: [][]string{{storeFUSE + ".0"}, {storeIPC + ".0"}, {storeRegion + "0.0"}}}
	if err := s.write(crash); err != nil {
		t.Fatal(err)
	}
	sent, unsendable := stateFile(t), stateFile(t)
	unsendable.Close()
	hs := handover.State{Parts: []handover.Part{{Name: partFS, State: []byte(`{}`), Files: 2}}}
	if err := s.keep(hs, []*os.File{sent, unsendable}); err == nil {
		t.Fatal("a keep with a closed descriptor succeeded")
	}
	if st, err := readState(s.states[:]); err == nil {
		t.Errorf("a keep cut short left a whole state naming %q", st.Names)
	}
	s.stop(true)
	if err := sdNotify("END=1"); err != nil {
		t.Fatal(err)
	}
	<-read
	if len(stored) > 0 {
		t.Errorf("left in the store after stop(true): %v", stored)
	}
}
