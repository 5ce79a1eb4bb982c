package ipc_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/ipc"
	"github.com/gdsfs/gdsfs/proto"
	"github.com/gdsfs/gdsfs/staging"
)

// TestResidentAcquireStagesNothing: an acquire (and an acquire_many
// item) asking for a resident file is answered ENODATA, naming the file,
// for one that is not, and stages nothing; once the file is resident the
// same request is granted.
func TestResidentAcquireStagesNothing(t *testing.T) {
	f := newFixture(t, ipc.SharingShared)
	f.write(t, "a", pattern(1<<20, 1))
	f.write(t, "b", pattern(1<<20, 2))
	r := dial(t, f.srv.Path())
	resp, fds := r.do(proto.Request{Op: proto.OpAcquire, Path: "a", Resident: true})
	if resp.OK || resp.Errno != "ENODATA" || !strings.Contains(resp.Error, "a: not resident") || len(fds) != 0 {
		t.Fatalf("resident acquire of a file not staged: %+v (%d descriptors); want ENODATA naming it", resp, len(fds))
	}
	if state, _ := f.cache.Attr("a"); state != staging.StateAbsent {
		t.Fatalf("after a refused resident acquire the file is %s; want absent (nothing staged)", state)
	}
	if _, err := f.cache.Stage(context.Background(), "a"); err != nil {
		t.Fatal(err)
	}
	resp, fds = r.do(proto.Request{Op: proto.OpAcquire, Path: "a", Resident: true})
	if !resp.OK || len(fds) != len(resp.Chunks) || len(fds) == 0 {
		t.Fatalf("resident acquire of a resident file: %+v (%d descriptors); want a grant", resp, len(fds))
	}
	resp, _ = r.do(proto.Request{Op: proto.OpAcquireMany, Paths: []string{"a", "b"}, Resident: true})
	if !resp.OK || len(resp.Files) != 2 || !resp.Files[0].OK || resp.Files[1].Errno != "ENODATA" {
		t.Fatalf("resident acquire_many of a resident and an absent file: %+v; want a grant and ENODATA", resp)
	}
	if state, _ := f.cache.Attr("b"); state != staging.StateAbsent {
		t.Fatalf("after a refused resident acquire_many item the file is %s; want absent", state)
	}
	resp, _ = r.do(proto.Request{Op: proto.OpAcquire, Path: "b"})
	if !resp.OK {
		t.Fatalf("plain acquire of the absent file: %+v; want it staged and granted", resp)
	}
}

// TestResidentAcquireOnAnotherDeviceCopiesNothing: a file resident on
// host0 only; a resident acquire naming host1 (placement replica, which
// would copy it there) is answered ENODATA, and no replica is made.
func TestResidentAcquireOnAnotherDeviceCopiesNothing(t *testing.T) {
	f := start(t, ipc.SharingShared, setup{devices: 2})
	f.write(t, "a", pattern(1<<20, 1))
	if _, err := f.cache.StageOn(context.Background(), "a", []string{"host0"}); err != nil {
		t.Fatal(err)
	}
	staged := func() (n int) {
		for _, d := range f.cache.Stats().Devices {
			n += d.StagedFiles
		}
		return n
	}
	r := dial(t, f.srv.Path())
	resp, _ := r.do(proto.Request{Op: proto.OpAcquire, Path: "a", Device: "host1", Resident: true})
	if resp.OK || resp.Errno != "ENODATA" {
		t.Fatalf("resident acquire on host1 of a file resident on host0 only: %+v; want ENODATA", resp)
	}
	if n := staged(); n != 1 {
		t.Fatalf("after it %d replicas are staged; want 1 (none made on host1)", n)
	}
	resp, _ = r.do(proto.Request{Op: proto.OpAcquire, Path: "a", Device: "host0", Resident: true})
	if !resp.OK || resp.Device != "host0" {
		t.Fatalf("resident acquire on host0, where it is resident: %+v; want a grant there", resp)
	}
}

// TestResidentAcquireDoesNotWaitForTheUidsRoom: over
// ipc.max_held_per_uid, a resident acquire is answered EDQUOT at once,
// where a plain one waits for the uid's room.
func TestResidentAcquireDoesNotWaitForTheUidsRoom(t *testing.T) {
	needRoot(t)
	f, blocked := startHeld(t, 20*time.Second)
	for _, rel := range []string{"a", "b"} {
		if _, err := f.cache.Stage(context.Background(), rel); err != nil {
			t.Fatal(err)
		}
	}
	h := dialAs(t, f.srv.Path(), nobody, nobody)
	if resp, _ := h.do(acquireReq("a")); !resp.OK {
		t.Fatalf("first acquire: %+v", resp)
	}
	r := dialAs(t, f.srv.Path(), nobody, nobody)
	resp, _ := r.do(proto.Request{Op: proto.OpAcquire, Path: "b", Resident: true})
	if resp.OK || resp.Errno != "EDQUOT" || !strings.Contains(resp.Error, "does not wait") {
		t.Fatalf("resident acquire over the uid's held bytes: %+v; want EDQUOT at once", resp)
	}
	if len(blocked) != 0 {
		t.Fatal("the resident acquire waited for the uid's room")
	}
}

// TestResidentAcquireOfAnUnreadableFileIsEACCES: whether a file the
// asker may not read is resident is not told: the answer is EACCES, as
// for a plain acquire.
func TestResidentAcquireOfAnUnreadableFileIsEACCES(t *testing.T) {
	needRoot(t)
	f := newFixture(t, ipc.SharingShared)
	p := f.write(t, "secret", pattern(1<<20, 3))
	if err := os.Chmod(p, 0o600); err != nil {
		t.Fatal(err)
	}
	r := dialAs(t, f.srv.Path(), nobody, nobody)
	for _, staged := range []bool{false, true} {
		if staged {
			if _, err := f.cache.Stage(context.Background(), "secret"); err != nil {
				t.Fatal(err)
			}
		}
		resp, _ := r.do(proto.Request{Op: proto.OpAcquire, Path: "secret", Resident: true})
		if resp.OK || resp.Errno != "EACCES" {
			t.Fatalf("resident acquire of a file nobody may not read (staged %v): %+v; want EACCES", staged, resp)
		}
	}
}

// TestGrantIdentityIsTheFileLeased: a grant asked for with identity says
// which file it holds: the node id the mount gives SOURCE's inode, and
// the size and times of the version staged. Without the mount's number
// for the inode, or without asking, the grant carries none.
func TestGrantIdentityIsTheFileLeased(t *testing.T) {
	var src string
	nodeID := func(dev, ino uint64) (uint64, bool) {
		var st unix.Stat_t
		if err := unix.Stat(filepath.Join(src, "unnumbered"), &st); err == nil && st.Ino == ino {
			return 0, false
		}
		return ino + 1000, true
	}
	f := start(t, ipc.SharingShared, setup{nodeID: nodeID})
	src = f.src
	p := f.write(t, "a", pattern(1<<20, 4))
	f.write(t, "unnumbered", pattern(1<<20, 5))
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	want := proto.FileIdentity{Ino: st.Ino + 1000, Size: st.Size, MtimeNS: st.Mtim.Nano(), CtimeNS: st.Ctim.Nano()}
	r := dial(t, f.srv.Path())
	resp, _ := r.do(proto.Request{Op: proto.OpAcquire, Path: "a", Identity: true})
	if !resp.OK || resp.Identity == nil || *resp.Identity != want {
		t.Fatalf("acquire with identity: %+v (identity %+v); want identity %+v", resp, resp.Identity, want)
	}
	resp, _ = r.do(proto.Request{Op: proto.OpAcquire, Path: "a"})
	if !resp.OK || resp.Identity != nil {
		t.Fatalf("acquire without identity: %+v; want a grant with none", resp)
	}
	resp, _ = r.do(proto.Request{Op: proto.OpAcquireMany, Paths: []string{"a", "unnumbered"}, Identity: true})
	if !resp.OK || len(resp.Files) != 2 || resp.Files[0].Identity == nil || *resp.Files[0].Identity != want ||
		!resp.Files[1].OK || resp.Files[1].Identity != nil {
		t.Fatalf("acquire_many with identity: %+v; want the first item's identity %+v and none for the inode the mount has not numbered", resp, want)
	}
}
