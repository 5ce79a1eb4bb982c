package fs

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gdsfs/gdsfs/internal/units"
	"github.com/gdsfs/gdsfs/staging"
)

// fakeStager records the calls fs makes, in order.
type fakeStager struct {
	mu     sync.Mutex
	calls  []string
	signal chan struct{}
}

func (f *fakeStager) record(call string) {
	f.mu.Lock()
	f.calls = append(f.calls, call)
	f.mu.Unlock()
	select {
	case f.signal <- struct{}{}:
	default:
	}
}

func (f *fakeStager) OpenedBy(rel string, _ staging.Reader) { f.record("opened " + rel) }
func (f *fakeStager) Closed(rel string)                     { f.record("closed " + rel) }
func (f *fakeStager) Changed(rel string)                    { f.record("changed " + rel) }
func (f *fakeStager) Attr(rel string) (state, path string)  { return "absent", "" }

// take returns the calls recorded so far and forgets them.
func (f *fakeStager) take() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.calls
	f.calls = nil
	return c
}

// waitFor waits until call was recorded (the kernel releases a file after
// close returns).
func (f *fakeStager) waitFor(t *testing.T, call string) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		f.mu.Lock()
		for _, c := range f.calls {
			if c == call {
				f.mu.Unlock()
				return
			}
		}
		f.mu.Unlock()
		select {
		case <-f.signal:
		case <-deadline:
			t.Fatalf("no %q among %q", call, f.take())
		}
	}
}

func mountForTest(t *testing.T, st Stager) (src, mnt string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("SKIPPED: mounting FUSE needs root (run make test as root)")
	}
	src, mnt = t.TempDir(), t.TempDir()
	srv, err := Mount(Config{Source: src, Mountpoint: mnt, Stager: st, Options: Options{
		Passthrough: PassthroughAuto, MaxRead: units.Size(1 << 20), EntryTimeout: time.Second, AttrTimeout: time.Second,
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := srv.Unmount(); err != nil {
			t.Error(err)
		}
		srv.Wait()
	})
	return src, mnt
}

// TestStagerHooks: reads open and close, every change through the mount
// is reported with the path it changed (both names of a rename).
func TestStagerHooks(t *testing.T) {
	st := &fakeStager{signal: make(chan struct{}, 1)}
	src, mnt := mountForTest(t, st)
	os.WriteFile(filepath.Join(src, "a"), []byte("a"), 0o644)
	os.Mkdir(filepath.Join(src, "d"), 0o755)

	b, err := os.ReadFile(filepath.Join(mnt, "a"))
	if err != nil || string(b) != "a" {
		t.Fatalf("read: %q %v", b, err)
	}
	st.waitFor(t, "closed a")
	if got := strings.Join(st.take(), ", "); got != "opened a, closed a" {
		t.Errorf("a read: %s", got)
	}
	for _, tc := range []struct {
		name string
		do   func() error
		want string // a call that must be among those recorded
	}{
		{"write", func() error { return os.WriteFile(filepath.Join(mnt, "a"), []byte("bb"), 0) }, "changed a"},
		{"truncate", func() error { return os.Truncate(filepath.Join(mnt, "a"), 1) }, "changed a"},
		{"chmod", func() error { return os.Chmod(filepath.Join(mnt, "a"), 0o600) }, "changed a"},
		{"create", func() error { return os.WriteFile(filepath.Join(mnt, "d/new"), nil, 0o644) }, "changed d/new"},
		{"link", func() error { return os.Link(filepath.Join(mnt, "a"), filepath.Join(mnt, "d/l")) }, "changed d/l"},
		{"rename from", func() error { return os.Rename(filepath.Join(mnt, "d/new"), filepath.Join(mnt, "b")) }, "changed d/new"},
		{"rename to", func() error { return os.Rename(filepath.Join(mnt, "b"), filepath.Join(mnt, "c")) }, "changed c"},
		{"unlink", func() error { return os.Remove(filepath.Join(mnt, "c")) }, "changed c"},
	} {
		if err := tc.do(); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		st.waitFor(t, tc.want)
		calls := st.take()
		for _, c := range calls {
			if strings.HasPrefix(c, "opened") {
				t.Errorf("%s: %q: a change is not an open for reading", tc.name, calls)
			}
		}
	}
}
