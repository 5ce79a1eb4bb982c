package ipc_test

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/client"
	"github.com/gdsfs/gdsfs/ipc"
	"github.com/gdsfs/gdsfs/proto"
)

func sh(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%v: %v\n%s", args, err, out)
	}
}

// TestLeasePermissionIsTheKernels: uid 65534 is refused files an ACL or
// a masked group denies it, and files behind a directory it may not
// search; FIFOs and devices are refused at once, never opened.
func TestLeasePermissionIsTheKernels(t *testing.T) {
	if _, err := exec.LookPath("setfacl"); err != nil {
		t.Fatalf("setfacl is not installed (.ci/run installs acl): %v", err)
	}
	f := newFixture(t, ipc.SharingShared)
	ok := f.write(t, "ok.bin", pattern(5000, 1))
	acl := f.write(t, "acl.bin", pattern(5000, 2))
	sh(t, "setfacl", "-m", "u:65534:---", acl)
	masked := f.write(t, "masked.bin", pattern(5000, 3))
	os.Chown(masked, 0, nobody)
	os.Chmod(masked, 0o640)
	sh(t, "setfacl", "-m", "g::r,m::---", masked)
	f.write(t, "private/sub/file", pattern(5000, 4))
	os.Chmod(filepath.Join(f.src, "private"), 0o700)
	os.MkdirAll(filepath.Join(f.src, "u"), 0o755)
	os.Symlink("../private/sub/file", filepath.Join(f.src, "u/link"))
	os.Symlink("../../etc/passwd", filepath.Join(f.src, "u/out"))
	if err := unix.Mkfifo(filepath.Join(f.src, "pipe"), 0o666); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mknod(filepath.Join(f.src, "null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
		t.Fatal(err)
	}
	_ = ok
	r := dialAs(t, f.srv.Path(), nobody, nobody)
	for path, want := range map[string]string{
		"ok.bin": "", "acl.bin": "EACCES", "masked.bin": "EACCES", "private/sub/file": "EACCES",
		"u/link": "EACCES", "u/out": "EACCES", "pipe": "EINVAL", "null": "EINVAL",
	} {
		done := make(chan proto.Response, 1)
		go func() {
			resp, _ := r.do(proto.Request{Op: proto.OpAcquire, Path: path})
			done <- resp
		}()
		select {
		case resp := <-done:
			if resp.Errno != want {
				t.Errorf("uid %d acquiring %s: %+v, want errno %q", nobody, path, resp, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("acquiring %s did not answer: a blocking open?", path)
		}
	}
	if st := f.srv.Stats(); st.LeaseDenied != 5 {
		t.Errorf("lease_denied %d, want 5", st.LeaseDenied)
	}
	// Root may read all but the FIFO and the device.
	root := dial(t, f.srv.Path())
	for _, p := range []string{"acl.bin", "masked.bin", "private/sub/file"} {
		if resp, _ := root.do(proto.Request{Op: proto.OpAcquire, Path: p}); !resp.OK {
			t.Errorf("root acquiring %s: %+v", p, resp)
		}
	}
}

// TestPermissionCheckedOnRepeat: a repeat lease (the fast path) still
// opens the file as the peer: a file made unreadable is refused.
func TestPermissionCheckedOnRepeat(t *testing.T) {
	f := newFixture(t, ipc.SharingShared)
	p := f.write(t, "a", pattern(5000, 1))
	r := dialAs(t, f.srv.Path(), nobody, nobody)
	a, _ := r.do(proto.Request{Op: proto.OpAcquire, Path: "a"})
	if !a.OK {
		t.Fatal(a.Error)
	}
	r.do(proto.Request{Op: proto.OpRelease, Lease: a.Lease})
	if b, _ := r.do(proto.Request{Op: proto.OpAcquire, Path: "a", Generation: a.Generation}); !b.Reuse {
		t.Fatalf("repeat lease: %+v, want reuse", b)
	}
	os.Chmod(p, 0o600)
	if c, _ := r.do(proto.Request{Op: proto.OpAcquire, Path: "a", Generation: a.Generation}); c.Errno != "EACCES" {
		t.Fatalf("repeat lease of a file made 0600: %+v, want EACCES", c)
	}
}

// TestSharedHostMappingRefusesWrites: a shared lease's memory cannot be
// made writable in the consumer (mprotect, or a writable mmap of the
// descriptor), and the next lease has the file's bytes. Writing through
// the mapping itself faults: the integration and Python tests do that in
// a child process.
func TestSharedHostMappingRefusesWrites(t *testing.T) {
	f := newFixture(t, ipc.SharingShared)
	data := pattern(100000, 5)
	f.write(t, "a", data)
	r := dial(t, f.srv.Path())
	resp, files := r.do(proto.Request{Op: proto.OpAcquire, Path: "a"})
	if !resp.OK {
		t.Fatal(resp.Error)
	}
	if _, err := unix.Mmap(int(files[0].Fd()), 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); !errors.Is(err, syscall.EPERM) {
		t.Fatalf("writable shared mmap of a leased memfd: %v, want EPERM", err)
	}
	c, _ := client.Dial(f.srv.Path())
	defer c.Close()
	l, err := c.Acquire("a")
	if err != nil {
		t.Fatal(err)
	}
	if !l.ReadOnly() {
		t.Fatal("a shared lease is not read-only")
	}
	_, _, errno := unix.Syscall(unix.SYS_MPROTECT, uintptr(l.Ptr()), 4096, unix.PROT_READ|unix.PROT_WRITE)
	if errno != syscall.EACCES {
		t.Fatalf("mprotect(PROT_WRITE) of a shared lease: %v, want EACCES", errno)
	}
	l.Close()
	l2, err := c.Acquire("a")
	if err != nil || !bytes.Equal(leaseBytes(t, l2), data) {
		t.Fatalf("next lease: %v, bytes equal %v", err, err == nil && bytes.Equal(leaseBytes(t, l2), data))
	}
	l2.Close()
	if !strings.Contains(resp.Sharing, "shared") {
		t.Fatal(resp.Sharing)
	}
}
