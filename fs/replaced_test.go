package fs

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/internal/units"
)

// mountWith mounts a new SOURCE with the given passthrough mode, read-write,
// and unmounts it in t.Cleanup.
func mountWith(t *testing.T, passthrough string) (srv *Server, src, mnt string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("SKIPPED: mounting FUSE needs root (run make test as root)")
	}
	src, mnt = t.TempDir(), t.TempDir()
	srv, err := Mount(Config{Source: src, Mountpoint: mnt, Options: Options{
		Passthrough: passthrough, MaxRead: units.Size(1 << 20), EntryTimeout: time.Second, AttrTimeout: time.Second,
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
	return srv, src, mnt
}

// openAfterReplace reaches dir/target (an O_PATH descriptor: a process
// whose open found the name before the change), then renames a new file
// over it or unlinks it as how says, and then opens what it reached
// (through /proc/self/fd, as the kernel finishes such an open). It returns
// what that open read, or its error.
func openAfterReplace(t *testing.T, dir, how string) string {
	t.Helper()
	target := filepath.Join(dir, "target")
	if err := os.WriteFile(target, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tmp"), []byte("new"), 0o644); err != nil {
		t.Fatal(err)
	}
	reached, err := unix.Open(target, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(reached)
	if how == "rename" {
		err = os.Rename(filepath.Join(dir, "tmp"), target)
	} else {
		err = os.Remove(target)
	}
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/self/fd/%d", reached))
	if err != nil {
		return err.Error()
	}
	return string(b)
}

// TestOpenRacingReplace: an open that reached a file before it was renamed
// over or unlinked through the mount opens the old file, as it does on
// SOURCE's own filesystem, with and without passthrough.
func TestOpenRacingReplace(t *testing.T) {
	for _, how := range []string{"rename", "unlink"} {
		if got := openAfterReplace(t, t.TempDir(), how); got != "old" {
			t.Fatalf("%s on the native filesystem: %s, want old (the test's own expectation)", how, got)
		}
		for _, pt := range []string{PassthroughOff, PassthroughAuto} {
			t.Run(how+"/passthrough="+pt, func(t *testing.T) {
				_, _, mnt := mountWith(t, pt)
				if got := openAfterReplace(t, mnt, how); got != "old" {
					t.Errorf("through the mount: %s, want old", got)
				}
			})
		}
	}
}

// TestOpenDuringRename: the daemon renames in SOURCE first and updates its
// tree of names after, so an open of the file renamed over can arrive in
// between, when its name leads to the new file. It opens the old file.
// The test makes that moment by running the rename handler alone (the
// go-fuse bridge moves the name after it), then the open handler.
func TestOpenDuringRename(t *testing.T) {
	srv, src, mnt := mountWith(t, PassthroughOff)
	os.WriteFile(filepath.Join(src, "target"), []byte("old"), 0o644)
	os.WriteFile(filepath.Join(src, "tmp"), []byte("new"), 0o644)
	for _, name := range []string{"target", "tmp"} {
		if _, err := os.Stat(filepath.Join(mnt, name)); err != nil { // the kernel looks both up
			t.Fatal(err)
		}
	}
	ctx := fuse.NewContext(context.Background(), &fuse.Caller{Pid: uint32(os.Getpid())})
	root := srv.tree
	old := root.GetChild("target").Operations().(*node)
	if errno := root.Rename(ctx, "tmp", root, "target", 0); errno != 0 {
		t.Fatalf("rename: %v", errno)
	}
	defer root.MvChild("tmp", root.EmbeddedInode(), "target", true) // as the bridge does next
	h, _, errno := old.Open(ctx, uint32(os.O_RDONLY))
	if errno != 0 {
		t.Fatalf("open of the file renamed over: %v, want it opened", errno)
	}
	defer h.(*file).Release(ctx)
	b := make([]byte, 8)
	k, err := unix.Pread(h.(*file).fd(), b, 0)
	if err != nil || string(b[:k]) != "old" {
		t.Fatalf("read %q %v, want old", b[:k], err)
	}
}

// TestOpenWhileRenaming: an open of the file renamed over that arrives
// while the rename handler runs, after the rename in SOURCE and before the
// handler returns, opens the old file: the node keeps it before SOURCE
// changes. The test makes that moment by opening from inside the change.
func TestOpenWhileRenaming(t *testing.T) {
	srv, src, mnt := mountWith(t, PassthroughOff)
	os.WriteFile(filepath.Join(src, "target"), []byte("old"), 0o644)
	os.WriteFile(filepath.Join(src, "tmp"), []byte("new"), 0o644)
	if _, err := os.Stat(filepath.Join(mnt, "target")); err != nil { // the kernel looks it up
		t.Fatal(err)
	}
	dir, err := unix.Open(src, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(dir)
	ctx := fuse.NewContext(context.Background(), &fuse.Caller{Pid: uint32(os.Getpid())})
	root := srv.tree
	old := root.GetChild("target").Operations().(*node)
	var got string
	err = root.replacing(dir, "target", func() error {
		if err := unix.Renameat(dir, "tmp", dir, "target"); err != nil {
			return err
		}
		h, _, errno := old.Open(ctx, uint32(os.O_RDONLY))
		if errno != 0 {
			got = "open: " + errno.Error()
			return nil
		}
		defer h.(*file).Release(ctx)
		b := make([]byte, 8)
		k, err := unix.Pread(h.(*file).fd(), b, 0)
		got = fmt.Sprint(string(b[:k]), err)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got != "old<nil>" {
		t.Fatalf("an open during the rename read %q, want the old file", got)
	}
}

// TestOpensAgainstRenamingWriter: readers open a name through the mount a
// fixed number of times while a writer renames new files over it through
// the mount; no open fails (on SOURCE's filesystem none does). The race is
// not forced, so this only adds to the two tests above.
func TestOpensAgainstRenamingWriter(t *testing.T) {
	const readers, opens = 4, 2000
	for _, pt := range []string{PassthroughOff, PassthroughAuto} {
		t.Run("passthrough="+pt, func(t *testing.T) {
			_, _, mnt := mountWith(t, pt)
			target := filepath.Join(mnt, "target")
			if err := os.WriteFile(target, []byte("v0"), 0o644); err != nil {
				t.Fatal(err)
			}
			stop := make(chan struct{})
			wrote := make(chan error, 1)
			go func() {
				for i := 0; ; i++ {
					select {
					case <-stop:
						wrote <- nil
						return
					default:
					}
					tmp := filepath.Join(mnt, fmt.Sprintf("tmp%d", i%4))
					if err := os.WriteFile(tmp, []byte(fmt.Sprint("v", i)), 0o644); err != nil {
						wrote <- err
						return
					}
					if err := os.Rename(tmp, target); err != nil {
						wrote <- err
						return
					}
				}
			}()
			failed := make(chan error, readers*opens)
			var wg sync.WaitGroup
			for range readers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range opens {
						f, err := os.Open(target)
						if err != nil {
							failed <- err
							continue
						}
						f.Close()
					}
				}()
			}
			wg.Wait()
			close(stop)
			if err := <-wrote; err != nil {
				t.Fatalf("writer: %v", err)
			}
			close(failed)
			if n := len(failed); n > 0 {
				t.Fatalf("%d of %d opens failed, the first: %v", n, readers*opens, <-failed)
			}
		})
	}
}
