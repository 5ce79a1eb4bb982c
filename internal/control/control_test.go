package control

import (
	"errors"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/gdsfs/gdsfs/internal/testkit/controltest"
)

// A refused line is the write's error (EAGAIN), and the next line goes
// through. Through os.OpenFile the descriptor was non-blocking under Go's
// poller and the refused write never returned (the hang of `gdsfs bench
// loader` once the prefetch queue was full).
func TestWriterSeesEAGAIN(t *testing.T) {
	mnt := t.TempDir()
	file := controltest.Mount(t, mnt, "prefetch")
	w, err := OpenWriter(filepath.Join(mnt, "prefetch"))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	controltest.RequireBlocking(t, w)
	if _, err := w.WriteString("a\n"); !errors.Is(err, syscall.EAGAIN) {
		t.Fatalf("first write: %v, want EAGAIN", err)
	}
	if _, err := w.WriteString("b\n"); err != nil {
		t.Fatalf("second write: %v", err)
	}
	if got := file.Lines(); len(got) != 1 || got[0] != "b\n" {
		t.Fatalf("the file took %q, want [\"b\\n\"]", got)
	}
}
