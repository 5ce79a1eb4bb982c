package integration

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
)

// TestRenameOverOpenFile: a file renamed over in SOURCE while the mount
// holds the old one open, within the entry timeout (made an hour here so
// the kernel surely keeps its entry): a new open through the mount reads
// the new content, and an fsync'ed write through it is in SOURCE's file.
// Passthrough on and off.
func TestRenameOverOpenFile(t *testing.T) {
	for _, pt := range []string{"on", "off"} {
		t.Run("passthrough="+pt, func(t *testing.T) {
			src := t.TempDir()
			oldText, newText := "old content\n", "new content, longer than the old one\n"
			os.WriteFile(filepath.Join(src, "f"), []byte(oldText), 0o644)
			m := startMount(t, src, "fuse.read_only=false", "fuse.passthrough="+pt,
				"fuse.entry_timeout=1h", "fuse.attr_timeout=1h")
			held, err := os.Open(m.path("f"))
			if err != nil {
				t.Fatal(err)
			}
			defer held.Close()
			if b, _ := io.ReadAll(held); string(b) != oldText {
				t.Fatalf("first read %q", b)
			}
			os.WriteFile(filepath.Join(src, "g"), []byte(newText), 0o644)
			if err := os.Rename(filepath.Join(src, "g"), filepath.Join(src, "f")); err != nil {
				t.Fatal(err)
			}
			f, err := os.OpenFile(m.path("f"), os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if b, _ := io.ReadAll(f); string(b) != newText {
				t.Fatalf("a new open after the rename reads %q, want %q", b, newText)
			}
			more := "written through the mount\n"
			if _, err := f.WriteAt([]byte(more), int64(len(newText))); err != nil {
				t.Fatal(err)
			}
			if err := f.Sync(); err != nil {
				t.Fatal(err)
			}
			if b, _ := os.ReadFile(filepath.Join(src, "f")); string(b) != newText+more {
				t.Fatalf("SOURCE holds %q after an fsync'ed write, want %q", b, newText+more)
			}
			if b, _ := io.ReadAll(io.NewSectionReader(held, 0, 1<<20)); string(b) != oldText {
				t.Errorf("the file held open reads %q, want the old content", b)
			}
		})
	}
}

// TestReopenAfterSizeChange: after SOURCE's file changed size, a new open
// through the mount reads exactly the new content, never cut to the old
// size or empty, though the kernel was told an attribute timeout of an
// hour. Passthrough on and off.
func TestReopenAfterSizeChange(t *testing.T) {
	const rounds = 2000
	for _, pt := range []string{"on", "off"} {
		t.Run("passthrough="+pt, func(t *testing.T) {
			src := t.TempDir()
			p := filepath.Join(src, "f")
			os.WriteFile(p, nil, 0o644)
			m := startMount(t, src, "fuse.passthrough="+pt, "fuse.entry_timeout=1h", "fuse.attr_timeout=1h")
			bad := 0
			for i := range rounds {
				// Sizes jump up and down across page boundaries.
				want := bytes.Repeat([]byte(fmt.Sprintf("%07d\n", i)), (i*7919)%4000+i%2)
				if err := os.WriteFile(p, want, 0o644); err != nil {
					t.Fatal(err)
				}
				got, err := os.ReadFile(m.path("f"))
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got, want) {
					if bad++; bad <= 5 {
						t.Errorf("round %d: read %d bytes, want %d", i, len(got), len(want))
					}
				}
			}
			if bad > 0 {
				t.Fatalf("%d of %d re-opened reads differ from the file", bad, rounds)
			}
		})
	}
}
