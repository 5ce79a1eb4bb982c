package ipc_test

import (
	"net"
	"os"
	"os/exec"
	"runtime"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/ipc"
	"github.com/gdsfs/gdsfs/proto"
)

// TestMain lets a test run this binary as a lease client in a process of
// its own (with other capabilities or in another user namespace): with
// GDSFS_IPC_TEST_SOCKET set, it acquires GDSFS_IPC_TEST_PATH there and
// prints the answer line.
func TestMain(m *testing.M) {
	if sock := os.Getenv("GDSFS_IPC_TEST_SOCKET"); sock != "" {
		os.Exit(acquireAndPrint(sock, os.Getenv("GDSFS_IPC_TEST_PATH")))
	}
	os.Exit(m.Run())
}

func acquireAndPrint(sock, path string) int {
	c, err := net.Dial("unix", sock)
	if err != nil {
		os.Stderr.WriteString(err.Error() + "\n")
		return 2
	}
	defer c.Close()
	if _, err := c.Write((&proto.Request{Op: proto.OpAcquire, Path: path}).Line()); err != nil {
		os.Stderr.WriteString(err.Error() + "\n")
		return 2
	}
	line, fds, err := proto.NewReader(c.(*net.UnixConn), proto.MaxAnswer).Next()
	proto.CloseFDs(fds)
	if err != nil {
		os.Stderr.WriteString(err.Error() + "\n")
		return 2
	}
	os.Stdout.Write(line)
	return 0
}

// acquireFrom runs this binary as a client, through the command wrap
// (setpriv, unshare, ...), and returns its answer to acquiring rel.
func acquireFrom(t *testing.T, f *fixture, rel string, wrap ...string) proto.Response {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	args := append(wrap, exe)
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = append(os.Environ(), "GDSFS_IPC_TEST_SOCKET="+f.srv.Path(), "GDSFS_IPC_TEST_PATH="+rel)
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("%v: %v\n%s", args, err, stderr)
	}
	resp, err := proto.DecodeResponse(out)
	if err != nil {
		t.Fatalf("%v: answer %q: %v", args, out, err)
	}
	return resp
}

// TestCapabilitiesNotUIDDecide: a uid-0 client with every capability
// dropped, or root of a user namespace of its own, cannot lease a 0600
// file owned by another uid; a root client with its capabilities can,
// and the capability-less one still leases its own.
func TestCapabilitiesNotUIDDecide(t *testing.T) {
	needRoot(t)
	f := newFixture(t, ipc.SharingShared)
	other := f.write(t, "other.bin", pattern(5000, 1))
	os.Chmod(other, 0o600)
	os.Chown(other, nobody, nobody)
	own := f.write(t, "own.bin", pattern(5000, 2))
	os.Chmod(own, 0o600)
	noCaps := []string{"setpriv", "--inh-caps=-all", "--bounding-set=-all"}
	ownNS := []string{"unshare", "--user", "--map-root-user"}
	for _, tc := range []struct {
		name  string
		wrap  []string
		rel   string
		errno string
	}{
		{"root", nil, "other.bin", ""},
		{"root without capabilities", noCaps, "other.bin", "EACCES"},
		{"root without capabilities, its own file", noCaps, "own.bin", ""},
		{"root of its own user namespace", ownNS, "other.bin", "EACCES"},
	} {
		if resp := acquireFrom(t, f, tc.rel, tc.wrap...); resp.Errno != tc.errno {
			t.Errorf("%s acquiring %s: %+v, want errno %q", tc.name, tc.rel, resp, tc.errno)
		}
	}
}

// TestPeerGroupsAreTheConnectionsOwn: the supplementary groups a lease is
// checked against are those of the connecting thread when it connected
// (SO_PEERGROUPS), not those /proc shows for its process now.
func TestPeerGroupsAreTheConnectionsOwn(t *testing.T) {
	needRoot(t)
	f := newFixture(t, ipc.SharingShared)
	p := f.write(t, "group.bin", pattern(5000, 1))
	os.Chown(p, 0, 4242)
	os.Chmod(p, 0o640)
	member := dialWithGroups(t, f.srv.Path(), nobody, nobody, []uint32{4242})
	if resp, _ := member.do(proto.Request{Op: proto.OpAcquire, Path: "group.bin"}); !resp.OK {
		t.Errorf("uid %d in group 4242: %+v, want the lease", nobody, resp)
	}
	stranger := dialWithGroups(t, f.srv.Path(), nobody, nobody, nil)
	if resp, _ := stranger.do(proto.Request{Op: proto.OpAcquire, Path: "group.bin"}); resp.Errno != "EACCES" {
		t.Errorf("uid %d in no group: %+v, want EACCES", nobody, resp)
	}
}

// TestThreadWithoutCapabilitiesGetsNone: a thread that changed its own
// effective uid connects while its process's main thread keeps root's
// capabilities: the peer gets none of them.
func TestThreadWithoutCapabilitiesGetsNone(t *testing.T) {
	needRoot(t)
	f := newFixture(t, ipc.SharingShared)
	p := f.write(t, "root.bin", pattern(5000, 1))
	os.Chmod(p, 0o600)
	r := dialAs(t, f.srv.Path(), nobody, nobody)
	if resp, _ := r.do(proto.Request{Op: proto.OpAcquire, Path: "root.bin"}); resp.Errno != "EACCES" {
		t.Errorf("uid %d (a thread of a root process): %+v, want EACCES", nobody, resp)
	}
}

// dialWithGroups connects with effective uid, gid and supplementary
// groups set on this thread only.
func dialWithGroups(t *testing.T, path string, uid, gid uint32, groups []uint32) *raw {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	saved := make([]uint32, 256)
	n, _, e := unix.RawSyscall(unix.SYS_GETGROUPS, uintptr(len(saved)), uintptr(unsafe.Pointer(&saved[0])), 0)
	if e != 0 {
		t.Fatalf("getgroups: %v", e)
	}
	saved = saved[:n]
	setgroups := func(g []uint32) unix.Errno {
		if len(g) == 0 {
			_, _, e := unix.RawSyscall(unix.SYS_SETGROUPS, 0, 0, 0)
			return e
		}
		_, _, e := unix.RawSyscall(unix.SYS_SETGROUPS, uintptr(len(g)), uintptr(unsafe.Pointer(&g[0])), 0)
		return e
	}
	if e := setgroups(groups); e != 0 {
		t.Fatalf("setgroups: %v", e)
	}
	r, err := dialAsErr(path, uid, gid)
	if setgroups(saved) != 0 {
		panic("cannot restore the thread's groups") // never hand it back to the scheduler
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return &raw{t: t, c: r, r: proto.NewReader(r, proto.MaxAnswer)}
}
