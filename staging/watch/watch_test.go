package watch

import (
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// recorder keeps what a subscriber heard.
type recorder struct {
	mu       sync.Mutex
	modified []FID
	changes  []Change
}

func (r *recorder) subscriber() Subscriber {
	return Subscriber{
		Modified: func(id FID) { r.mu.Lock(); r.modified = append(r.modified, id); r.mu.Unlock() },
		Entries:  func(c Change) { r.mu.Lock(); r.changes = append(r.changes, c); r.mu.Unlock() },
	}
}

// has reports whether an entry change with a mask bit of mask was heard
// for name in directory dir.
func (r *recorder) has(dir FID, name string, mask uint64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range r.changes {
		if c.Dir == dir && c.Name == name && c.Mask&mask != 0 {
			return true
		}
	}
	return false
}

// TestEntryEvents: creates, removals, renames and attribute changes in a
// watched directory reach the entries subscriber with the directory and
// the name; a write reaches the modified subscriber with the file.
func TestEntryEvents(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("SKIPPED: fanotify needs root (run make test as root)")
	}
	dir := t.TempDir()
	w := New(Auto, nil)
	defer w.Close()
	d, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	var st unix.Stat_t
	unix.Fstat(int(d.Fd()), &st)
	events, why := w.ProbeEntries(d, st.Dev)
	if !events {
		t.Skipf("SKIPPED: no entry events for %s: %s", dir, why)
	}
	dirID, _, _ := w.Probe(d, st.Dev)
	r := &recorder{}
	w.Subscribe(r.subscriber())
	p := func(n string) string { return filepath.Join(dir, n) }
	for _, tc := range []struct {
		name string
		do   func() error
		at   string
		mask uint64
	}{
		{"create", func() error { return os.WriteFile(p("a"), nil, 0o644) }, "a", unix.FAN_CREATE},
		{"chmod", func() error { return os.Chmod(p("a"), 0o600) }, "a", unix.FAN_ATTRIB},
		{"rename from", func() error { return os.Rename(p("a"), p("b")) }, "a", unix.FAN_MOVED_FROM},
		{"rename to", func() error { return nil }, "b", unix.FAN_MOVED_TO},
		{"mkdir", func() error { return os.Mkdir(p("sub"), 0o755) }, "sub", unix.FAN_CREATE},
		{"unlink", func() error { return os.Remove(p("b")) }, "b", unix.FAN_DELETE},
	} {
		if err := tc.do(); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		w.Drain()
		if !r.has(dirID, tc.at, tc.mask) {
			t.Errorf("%s: no event with mask %#x for %s", tc.name, tc.mask, tc.at)
		}
	}
	f, err := os.Create(p("c"))
	if err != nil {
		t.Fatal(err)
	}
	fileID, _, _ := w.Probe(f, st.Dev)
	f.Write([]byte("x"))
	f.Close()
	w.Drain()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, id := range r.modified {
		if id == fileID {
			return
		}
	}
	t.Errorf("a write to c was not reported modified (%d reports)", len(r.modified))
}

// TestTimestampsModeReportsNothing: mode timestamps opens no group.
func TestTimestampsModeReportsNothing(t *testing.T) {
	w := New(Timestamps, nil)
	defer w.Close()
	d, err := os.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if events, why := w.ProbeEntries(d, 1); events || why != "staging.watch is timestamps" {
		t.Errorf("ProbeEntries = %v, %q", events, why)
	}
	if m := w.Mode(1); m != "timestamps: staging.watch is timestamps" {
		t.Errorf("Mode = %q", m)
	}
}

// TestMountsReported: a filesystem mounted on a directory, and unmounted
// from it, is reported to the mounts subscriber by the next Drain.
func TestMountsReported(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("SKIPPED: mounting needs root (run make test as root)")
	}
	w := New(Auto, nil)
	defer w.Close()
	if w.mounts == nil {
		t.Fatalf("mount table not followed: %s", w.noMount)
	}
	var mu sync.Mutex
	var got []string
	w.Subscribe(Subscriber{Mounts: func(p string) { mu.Lock(); got = append(got, p); mu.Unlock() }})
	dir := filepath.Join(t.TempDir(), "a dir")
	os.Mkdir(dir, 0o755)
	heard := func(what string) {
		t.Helper()
		w.Drain()
		mu.Lock()
		defer mu.Unlock()
		if !slices.Contains(got, dir) {
			t.Errorf("%s %q: heard %q", what, dir, got)
		}
		got = nil
	}
	if err := unix.Mount("gdsfs-test", dir, "tmpfs", 0, ""); err != nil {
		t.Fatal(err)
	}
	heard("mount on")
	if err := unix.Unmount(dir, 0); err != nil {
		t.Fatal(err)
	}
	heard("unmount from")
}

func TestUnescape(t *testing.T) {
	for in, want := range map[string]string{
		"/plain": "/plain", `/a\040b`: "/a b", `/t\011\134`: "/t\t\\", `/short\04`: `/short\04`,
	} {
		if got := unescape(in); got != want {
			t.Errorf("unescape(%q) = %q, want %q", in, got, want)
		}
	}
}
