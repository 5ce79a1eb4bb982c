package daemon

import (
	"fmt"
	"os"
	"strings"
	"testing"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/internal/mountinfo"
)

func needFUSE(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("SKIPPED: mounting FUSE needs root (run make test as root)")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skip("SKIPPED: no /dev/fuse: " + err.Error())
	}
}

type emptyRoot struct{ gofs.Inode }

// TestUmountIfDeadLeavesLiveMount: a fuse.gdsfs mount whose daemon (here,
// this process) answers is not unmounted.
func TestUmountIfDeadLeavesLiveMount(t *testing.T) {
	needFUSE(t)
	mnt := t.TempDir()
	srv, err := gofs.Mount(mnt, &emptyRoot{}, &gofs.Options{MountOptions: fuse.MountOptions{
		Name: "gdsfs", FsName: "live", DirectMountStrict: true}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Unmount(); srv.Wait() })
	var out strings.Builder
	done, err := UnmountIfDead(mnt, &out)
	if err != nil || done {
		t.Fatalf("unmountIfDead on a live mount: unmounted %v, %v", done, err)
	}
	if fstype, ok := mountinfo.MountedAt(mnt); !ok || fstype != "fuse.gdsfs" {
		t.Fatalf("the live mount is gone (%q %v)", fstype, ok)
	}
	if !strings.Contains(out.String(), "live daemon; left alone") {
		t.Errorf("output %q does not say the mount was left alone", out.String())
	}
}

// TestUmountIfDeadClearsDeadMount: a fuse.gdsfs mount whose /dev/fuse
// descriptor was closed answers ENOTCONN and is unmounted.
func TestUmountIfDeadClearsDeadMount(t *testing.T) {
	needFUSE(t)
	mnt := t.TempDir()
	fd, err := unix.Open("/dev/fuse", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	err = unix.Mount("dead", mnt, "fuse.gdsfs", unix.MS_NOSUID|unix.MS_NODEV,
		fmt.Sprintf("fd=%d,rootmode=40000,user_id=0,group_id=0", fd))
	unix.Close(fd) // the daemon is gone
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, ok := mountinfo.MountedAt(mnt); ok {
			unix.Unmount(mnt, unix.MNT_DETACH)
		}
	})
	var out strings.Builder
	done, err := UnmountIfDead(mnt, &out)
	if err != nil || !done {
		t.Fatalf("unmountIfDead on a dead mount: unmounted %v, %v (%s)", done, err, out.String())
	}
	if _, ok := mountinfo.MountedAt(mnt); ok {
		t.Fatal("the dead mount is still there")
	}
}

// TestUmountIfDeadNothingMounted: no mount, nothing done, no error.
func TestUmountIfDeadNothingMounted(t *testing.T) {
	var out strings.Builder
	if done, err := UnmountIfDead(t.TempDir(), &out); done || err != nil {
		t.Fatalf("unmountIfDead on a plain directory: %v, %v", done, err)
	}
}
