package ipc_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"syscall"
	"testing"

	"github.com/gdsfs/gdsfs/client"
	"github.com/gdsfs/gdsfs/ipc"
)

// useSocket points the Go client at f's socket for paths under
// /mnt/gds, which it is told is a gdsfs mount of this process's euid; it
// sends them relative to it.
func useSocket(t *testing.T, f *fixture) {
	t.Setenv("GDSFS_SOCKET", f.srv.Path())
	t.Cleanup(client.MountinfoForTest([]byte(fmt.Sprintf(
		"22 1 8:1 / / rw - ext4 /dev/sda1 rw\n40 22 0:99 / /mnt/gds rw - fuse.gdsfs /src rw,user_id=%d,group_id=0\n", os.Geteuid()))))
	client.DropCache()
	t.Cleanup(client.DropCache)
}

// TestRepeatLeaseReusesMapping: a second Open of an unchanged file reuses
// the kept mapping (no descriptors), on the connection that holds it.
func TestRepeatLeaseReusesMapping(t *testing.T) {
	f := newFixture(t, ipc.SharingShared)
	data := pattern(200000, 1)
	f.write(t, "a", data)
	useSocket(t, f)
	l1, err := client.Open("/mnt/gds/a")
	if err != nil {
		t.Fatal(err)
	}
	ptr := l1.Ptr()
	l1.Close()
	if _, err := l1.ReadAt(make([]byte, 1), 0); !errors.Is(err, client.ErrClosed) {
		t.Fatalf("ReadAt after Close: %v, want ErrClosed", err)
	}
	l2, err := client.Open("/mnt/gds/a")
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Close()
	if !l2.Reused() || l2.Ptr() != ptr || l2.Generation() != l1.Generation() || !bytes.Equal(leaseBytes(t, l2), data) {
		t.Fatalf("repeat lease: reused %v, ptr %#x (first %#x)", l2.Reused(), l2.Ptr(), ptr)
	}
	if st := f.srv.Stats(); st.OpenConnections != 1 || st.HeldFiles != 1 || st.LeasesActive != 1 {
		t.Fatalf("server: %+v, want one connection holding one file, one lease", st)
	}
}

// TestRepeatLeaseAfterChange: a kept mapping is never handed out once the
// file changed: the next lease maps the new bytes. It fails if the client
// takes the daemon's answer for a reuse without checking it said so for
// the generation held.
func TestRepeatLeaseAfterChange(t *testing.T) {
	f := newFixture(t, ipc.SharingShared)
	f.write(t, "a", pattern(200000, 1))
	useSocket(t, f)
	for i := 2; i < 6; i++ {
		l, err := client.Open("/mnt/gds/a")
		if err != nil {
			t.Fatal(err)
		}
		l.Close()
		want := pattern(150000+i*4096, i)
		f.write(t, "a", want)
		l, err = client.Open("/mnt/gds/a")
		if err != nil {
			t.Fatal(err)
		}
		if l.Reused() || l.Size() != int64(len(want)) || !bytes.Equal(leaseBytes(t, l), want) {
			t.Fatalf("round %d: reused %v, %d bytes: old bytes after a change", i, l.Reused(), l.Size())
		}
		l.Close()
	}
	client.DropCache()
	f.waitClosed(t, 5)
	if st := f.srv.Stats(); st.OpenConnections != 0 || st.HeldBytes != 0 {
		t.Fatalf("after DropCache: %+v", st)
	}
}

// TestOpenMany: one round trip for many files; all or nothing.
func TestOpenMany(t *testing.T) {
	f := newFixture(t, ipc.SharingShared)
	var paths [][]byte
	var names []string
	for i := range 20 {
		d := pattern(1000+i*3000, i)
		paths = append(paths, d)
		name := "/mnt/gds/f" + string(rune('a'+i))
		f.write(t, name[len("/mnt/gds/"):], d)
		names = append(names, name)
	}
	useSocket(t, f)
	ls, err := client.OpenMany(names)
	if err != nil {
		t.Fatal(err)
	}
	for i, l := range ls {
		if !bytes.Equal(leaseBytes(t, l), paths[i]) {
			t.Fatalf("file %d differs", i)
		}
	}
	if st := f.srv.Stats(); st.OpenConnections != 1 || st.HeldFiles != 20 || st.Requests != 1 {
		t.Fatalf("one batch: %+v, want one connection, one request", st)
	}
	for _, l := range ls {
		l.Close()
	}
	again, err := client.OpenMany(names)
	if err != nil {
		t.Fatal(err)
	}
	for i, l := range again {
		if !l.Reused() || !bytes.Equal(leaseBytes(t, l), paths[i]) {
			t.Fatalf("repeat batch: file %d reused %v", i, l.Reused())
		}
		l.Close()
	}
	if _, err := client.OpenMany(append(names[:3:3], "/mnt/gds/missing")); !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("a batch with a missing file: %v, want ENOENT", err)
	}
	client.DropCache()
	f.waitClosed(t, 1)
	if st := f.srv.Stats(); st.HeldBytes != 0 || st.LeasesActive != 0 {
		t.Fatalf("after the failed batch and DropCache: %+v", st)
	}
}

// TestPrivateLeasesAreNotKept: private copies are writable and never
// kept: closing one ends its connection.
func TestPrivateLeasesAreNotKept(t *testing.T) {
	f := newFixture(t, ipc.SharingPrivate)
	f.write(t, "a", pattern(5000, 1))
	useSocket(t, f)
	l, err := client.Open("/mnt/gds/a")
	if err != nil {
		t.Fatal(err)
	}
	if l.ReadOnly() || l.Sharing() != "private" {
		t.Fatalf("private lease: read-only %v, sharing %q", l.ReadOnly(), l.Sharing())
	}
	l.Close()
	f.waitClosed(t, 1)
}

// TestEpochOverManyFilesIsKept: a second pass over 320 files in 40
// batches (more batches than the connections a process keeps, and more
// files than 256, so a client keeping fewer would make every lease of an
// epoch over them a fresh one) is leased again from kept mappings, all on
// the one connection the batches were leased on.
func TestEpochOverManyFilesIsKept(t *testing.T) {
	f := newFixture(t, ipc.SharingShared)
	var names []string
	var datas [][]byte
	for i := range 320 {
		d := pattern(100+i, i)
		name := fmt.Sprintf("e%03d", i)
		f.write(t, name, d)
		names, datas = append(names, "/mnt/gds/"+name), append(datas, d)
	}
	useSocket(t, f)
	for pass := range 2 {
		for k := 0; k < len(names); k += 8 {
			ls, err := client.OpenMany(names[k : k+8])
			if err != nil {
				t.Fatal(err)
			}
			for i, l := range ls {
				if !bytes.Equal(leaseBytes(t, l), datas[k+i]) || (pass == 1 && !l.Reused()) {
					t.Fatalf("pass %d, file %d: reused %v", pass, k+i, l.Reused())
				}
				l.Close()
			}
		}
	}
	if st := f.srv.Stats(); st.OpenConnections != 1 || st.HeldFiles != 320 {
		t.Fatalf("%+v, want 1 connection holding 320 files", st)
	}
}
