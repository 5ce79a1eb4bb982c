package fs

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/gdsfs/gdsfs/internal/access"
	"github.com/gdsfs/gdsfs/internal/units"
)

// mountWithControl mounts a fresh SOURCE holding a.bin with one writable
// control file, "prefetch", whose writes arrive on the returned channel.
func mountWithControl(t *testing.T) (mnt string, got <-chan string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("SKIPPED: mounting FUSE needs root (run make test as root)")
	}
	src, mnt := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "a.bin"), []byte("a"), 0o644); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 16)
	srv, err := Mount(Config{Source: src, Mountpoint: mnt, Stager: &fakeStager{signal: make(chan struct{}, 1)},
		Options: Options{Passthrough: PassthroughOff, MaxRead: units.Size(1 << 20), EntryTimeout: time.Second, AttrTimeout: time.Second},
		Controls: func(*Server) []Control {
			return []Control{{Name: "prefetch", Write: func(c access.Cred, rel string) error { lines <- rel; return nil }}}
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
	return mnt, lines
}

func openControl(t *testing.T, mnt string) *os.File {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(mnt, ".gdsfs/prefetch"), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func wantLine(t *testing.T, got <-chan string, want string) {
	t.Helper()
	select {
	case l := <-got:
		if l != want {
			t.Fatalf("control got %q, want %q", l, want)
		}
	default:
		t.Fatalf("control got nothing, want %q", want)
	}
}

// TestControlLongLineRefused: a line without a newline longer than a path
// can be fails the write with ENAMETOOLONG; the rest of that line up to
// its newline is dropped, and the next line is acted on alone.
func TestControlLongLineRefused(t *testing.T) {
	mnt, got := mountWithControl(t)
	f := openControl(t, mnt)
	long := bytes.Repeat([]byte("x"), 64<<10)
	if _, err := f.Write(long); !errors.Is(err, syscall.ENAMETOOLONG) {
		t.Fatalf("write of a 64KiB line without newline: %v, want ENAMETOOLONG", err)
	}
	if _, err := f.Write([]byte("more of it")); !errors.Is(err, syscall.ENAMETOOLONG) {
		t.Fatalf("write continuing the refused line: %v, want ENAMETOOLONG", err)
	}
	if _, err := f.Write([]byte("end\na.bin\n")); !errors.Is(err, syscall.ENAMETOOLONG) {
		t.Fatalf("write ending the refused line: %v, want ENAMETOOLONG", err)
	}
	wantLine(t, got, "a.bin")
	if _, err := f.Write([]byte("a.bin\n")); err != nil {
		t.Fatalf("a line after the refused one: %v", err)
	}
	wantLine(t, got, "a.bin")
}

// TestControlLineAcrossWrites: a line written in pieces is acted on once,
// whole; the last line may lack its newline (acted on at close).
func TestControlLineAcrossWrites(t *testing.T) {
	mnt, got := mountWithControl(t)
	f := openControl(t, mnt)
	for _, piece := range []string{"a", ".", "bin\na.b", "in"} {
		if _, err := f.Write([]byte(piece)); err != nil {
			t.Fatalf("write %q: %v", piece, err)
		}
	}
	wantLine(t, got, "a.bin")
	if err := f.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	wantLine(t, got, "a.bin")
}

// TestControlBufferBounded: fed a line without newline in pieces, the
// writer's buffer never passes maxControlLine, every write from the one
// that crosses it fails, and the line after the newline comes out alone.
func TestControlBufferBounded(t *testing.T) {
	w := &controlWriter{file: &controlFile{srv: &Server{log: zap.NewNop()}, ctl: Control{Name: "prefetch"}}}
	piece := []byte(strings.Repeat("y", 4000))
	crossed := false
	for i := 0; i < 1000; i++ {
		lines, errno := w.split(piece, false)
		if len(lines) != 0 {
			t.Fatalf("write %d: lines %q from a line without newline", i, lines)
		}
		crossed = crossed || (i+1)*len(piece) > maxControlLine
		if want := map[bool]syscall.Errno{false: 0, true: syscall.ENAMETOOLONG}[crossed]; errno != want {
			t.Fatalf("write %d (%d bytes so far): errno %v, want %v", i, (i+1)*len(piece), errno, want)
		}
		if len(w.partial) > maxControlLine {
			t.Fatalf("write %d: %d bytes buffered, limit %d", i, len(w.partial), maxControlLine)
		}
	}
	lines, errno := w.split([]byte("tail\nnext"), false)
	if errno != syscall.ENAMETOOLONG || len(lines) != 0 {
		t.Fatalf("end of the refused line: lines %q errno %v", lines, errno)
	}
	lines, errno = w.split(nil, true)
	if errno != 0 || len(lines) != 1 || string(lines[0]) != "next" {
		t.Fatalf("final line: lines %q errno %v, want [next]", lines, errno)
	}
}
