package daemon

import (
	"os"
	"strings"
	"testing"

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
	st := storedState{Source: "/s", Parts: []handover.Part{{Name: partCache, State: []byte(`{}`), Files: 2}},
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
