package triggers

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/internal/testkit/testfiles"
)

// idleCore is a cache that stages nothing: the tests here look at the
// staging after reads' own state.
type idleCore struct{}

func (idleCore) Go(f func()) bool           { return false }
func (idleCore) StageAfterRead(string) bool { return false }
func (idleCore) CancelYielding(string)      {}
func (idleCore) Staged(string) bool         { return false }
func (idleCore) Done() <-chan struct{}      { return nil }
func (idleCore) Prefetch(string) bool       { return false }
func (idleCore) OpenSource(rel string) (*os.File, *unix.Stat_t, error) {
	return nil, nil, os.ErrNotExist
}

// TestPageCacheOf counts a real file's cached pages with cachestat.
func TestPageCacheOf(t *testing.T) {
	dir := t.TempDir()
	data := randomBytes(4<<20, 1)
	writeFile(t, dir, "f", data)
	f, err := os.Open(filepath.Join(dir, "f"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	size := int64(len(data))
	pages := size / int64(os.Getpagesize())
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		t.Fatal(err)
	}
	if n, whole := pageCacheOf(f, size); whole || n > pages/4 {
		t.Skipf("SKIP: the page cache of %s cannot be dropped (%d of %d pages stay): this filesystem keeps it", dir, n, pages)
	}
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_RANDOM); err != nil { // no read-ahead
		t.Fatal(err)
	}
	// Reclaim may take a page between the read and the count (a busy
	// machine): each read is done again, a few times, before a count
	// other than the pages read is a failure.
	readCounted := func(what string, n int64, want int64, wantWhole bool) {
		t.Helper()
		var got int64
		var whole bool
		for range 5 {
			if _, err := f.ReadAt(make([]byte, n), 0); err != nil {
				t.Fatal(err)
			}
			if got, whole = pageCacheOf(f, size); got == want && whole == wantWhole {
				return
			}
		}
		t.Fatalf("%s: %d of %d pages cached (whole %v)", what, got, pages, whole)
	}
	readCounted("half read", size/2, pages/2, false)
	readCounted("all read", size, pages, true)
}

// TestProcessOf: the FUSE request names a thread; its process is what
// maps files (a thread that opened and mapped the file, then exited,
// took its /proc/TID/maps with it).
func TestProcessOf(t *testing.T) {
	got := make(chan uint32)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread exits with the goroutine
		got <- processOf(uint32(unix.Gettid()))
	}()
	if p := <-got; p != uint32(os.Getpid()) {
		t.Fatalf("the process of another thread of this process is %d, want %d", p, os.Getpid())
	}
	if p := processOf(1 << 30); p != 0 {
		t.Fatalf("the process of a thread that does not exist is %d", p)
	}
}

// TestMappedBy reads /proc/PID/maps: this process's mapping of a file is
// found by the file's device and inode, and gone after munmap; a process
// that does not exist maps nothing.
func TestMappedBy(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "f", randomBytes(8192, 1))
	writeFile(t, dir, "g", randomBytes(8192, 2))
	var st, other unix.Stat_t
	if err := unix.Stat(filepath.Join(dir, "f"), &st); err != nil {
		t.Fatal(err)
	}
	if err := unix.Stat(filepath.Join(dir, "g"), &other); err != nil {
		t.Fatal(err)
	}
	unmap := mapFile(t, filepath.Join(dir, "f"), 8192)
	me := []opener{{pid: uint32(os.Getpid())}}
	if !mappedBy(me, st.Dev, st.Ino) {
		t.Fatal("this process's mapping of f not found")
	}
	if mappedBy(me, other.Dev, other.Ino) {
		t.Fatal("g, never mapped, found mapped")
	}
	// Through a mount, maps shows the mount's device and inode, which the
	// opener carries.
	through := []opener{{pid: uint32(os.Getpid()), dev: st.Dev, ino: st.Ino}}
	if !mappedBy(through, other.Dev, other.Ino) {
		t.Fatal("the mapping by the identity the opener saw not found")
	}
	if mappedBy([]opener{{pid: 1 << 30}}, st.Dev, st.Ino) {
		t.Fatal("a process that does not exist maps f")
	}
	unmap()
	if mappedBy(me, st.Dev, st.Ino) {
		t.Fatal("f found mapped after munmap")
	}
}

// TestReopenKeepsTheNewestOpener: a reopen during a
// wait that watched four processes kept those four and dropped the
// process that had just opened the file.
func TestReopenKeepsTheNewestOpener(t *testing.T) {
	a := NewAfterRead(AfterReadOptions{MapMin: 0})
	a.Attach(&idleCore{})
	s := &settling{stop: make(chan struct{}), openers: []opener{{pid: 101}, {pid: 102}, {pid: 103}, {pid: 104}}}
	a.mu.Lock()
	a.settling["f"] = s
	a.mu.Unlock()
	a.Opened("f", Reader{PID: uint32(unix.Gettid()), Size: 50000})
	a.mu.Lock()
	got := a.readers["f"].openers
	a.mu.Unlock()
	if len(got) != maxOpeners || got[len(got)-1].pid != uint32(os.Getpid()) {
		t.Fatalf("openers after the reopen: %+v, want the last four ending with this process %d", got, os.Getpid())
	}
}

// askCore is a cache that stages nothing; step runs once, when Staged is
// first asked (the last close waits for the answer), and what the
// staging after reads asks of it is counted.
type askCore struct {
	idleCore
	step          func()
	staged, goes  int
	stagedAnswers bool
}

func (c *askCore) Staged(string) bool {
	if f := c.step; f != nil {
		c.step = nil
		f()
	}
	return c.stagedAnswers
}
func (c *askCore) StageAfterRead(string) bool { c.staged++; return true }
func (c *askCore) Go(func()) bool             { c.goes++; return false }

// TestLastCloseEndedWhileItAsks: what comes while the last close asks the
// cache whether its file is staged ends its staging as it ends a settling
// wait: a reader opening the file again (its own last close stages it),
// an explicit evict (Cancel), Stop. Nothing is staged or waited for.
func TestLastCloseEndedWhileItAsks(t *testing.T) {
	for _, tc := range []struct {
		name       string
		step       func(a *AfterRead)
		open, ends int // files open after it; stagings and settling waits the second close starts
	}{
		{"reopened", func(a *AfterRead) { a.Opened("f", Reader{}) }, 1, 1},
		{"cancelled", func(a *AfterRead) { a.Cancel("f") }, 0, 0},
		{"stopped", func(a *AfterRead) { a.Stop() }, 0, 0},
	} {
		for _, staged := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s staged %v", tc.name, staged), func(t *testing.T) {
				a := NewAfterRead(AfterReadOptions{})
				core := &askCore{stagedAnswers: staged}
				core.step = func() { tc.step(a) }
				a.Attach(core)
				a.Opened("f", Reader{})
				a.Closed("f")
				if core.staged != 0 || core.goes != 0 || a.Settling() != 0 || a.Open() != tc.open {
					t.Fatalf("staged %d, settling waits started %d, running %d, files open %d; want 0, 0, 0, %d",
						core.staged, core.goes, a.Settling(), a.Open(), tc.open)
				}
				a.Closed("f") // the reopened reader's last close
				if core.staged+core.goes != tc.ends {
					t.Fatalf("after the reader that opened it meanwhile closed it: %d stagings, %d settling waits; want %d in all",
						core.staged, core.goes, tc.ends)
				}
			})
		}
	}
}

var (
	randomBytes = testfiles.RandomBytes
	writeFile   = testfiles.WriteFile
	mapFile     = testfiles.MapFile
)
