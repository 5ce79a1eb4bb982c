package ipc_test

import (
	"bytes"
	"errors"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gdsfs/gdsfs/client"
	"github.com/gdsfs/gdsfs/ipc"
	"github.com/gdsfs/gdsfs/proto"
)

func TestAcquireReadRelease(t *testing.T) {
	f := newFixture(t, ipc.SharingShared)
	data := pattern(300000, 1) // five 64 KiB chunks
	f.write(t, "d/x.bin", data)
	c, err := client.Dial(f.srv.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, p := range []string{"d/x.bin", "/mnt/gds/d/x.bin", "/d/x.bin"} {
		l, err := c.Acquire(p)
		if err != nil {
			t.Fatalf("acquire %s: %v", p, err)
		}
		if l.Device() != "host" || l.Size() != int64(len(data)) || !bytes.Equal(leaseBytes(t, l), data) {
			t.Fatalf("%s: lease %s %d bytes, content equal %v", p, l.Device(), l.Size(), bytes.Equal(leaseBytes(t, l), data))
		}
		if got := f.srv.Stats().LeasesActive; got != 1 {
			t.Fatalf("leases active %d, want 1", got)
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
	}
	st, err := c.Stat("d/x.bin")
	if err != nil || st.State != "resident" || st.Size != int64(len(data)) || st.LoadPath != "host" {
		t.Fatalf("stat: %+v %v", st, err)
	}
	for p, want := range map[string]syscall.Errno{"missing": syscall.ENOENT, "d": syscall.EINVAL, "/": syscall.EINVAL} {
		if _, err := c.Acquire(p); !errors.Is(err, want) {
			t.Errorf("acquire %q: %v, want %v", p, err, want)
		}
	}
}

// TestReleaseKeepsBytesUntilClose: a release ends the lease id, not the
// bytes; closing the connection ends them (PLAN's capacity rule).
func TestReleaseKeepsBytesUntilClose(t *testing.T) {
	f := newFixture(t, ipc.SharingShared)
	f.write(t, "a", pattern(1000, 1))
	f.write(t, "b", pattern(70000, 2))
	r := dial(t, f.srv.Path())
	var ids []uint64
	for _, p := range []string{"a", "b", "a"} {
		resp, _ := r.do(proto.Request{Op: proto.OpAcquire, Path: p})
		if !resp.OK {
			t.Fatalf("acquire %s: %+v", p, resp)
		}
		ids = append(ids, resp.Lease)
	}
	if st := f.srv.Stats(); st.LeasesActive != 3 || st.HeldFiles != 2 || st.HeldBytes != 4096+73728 {
		t.Fatalf("after three leases of two files: %+v", st)
	}
	for _, id := range ids {
		if resp, _ := r.do(proto.Request{Op: proto.OpRelease, Lease: id}); !resp.OK {
			t.Fatalf("release %d: %+v", id, resp)
		}
	}
	st := f.srv.Stats()
	if st.LeasesActive != 0 || st.HeldFiles != 2 || f.cache.Stats().LeasesActive != 2 {
		t.Fatalf("released: ipc %+v, staging leases %d; want 0 active, 2 files still held", st, f.cache.Stats().LeasesActive)
	}
	r.c.Close()
	f.waitClosed(t, 1)
	if st := f.srv.Stats(); st.HeldFiles != 0 || st.HeldBytes != 0 || f.cache.Stats().LeasesActive != 0 || st.OpenConnections != 0 {
		t.Fatalf("after close: %+v, staging leases %d", st, f.cache.Stats().LeasesActive)
	}
}

func TestClosingConnectionReleases(t *testing.T) {
	f := newFixture(t, ipc.SharingShared)
	f.write(t, "a", pattern(1000, 1))
	f.write(t, "b", pattern(2000, 2))
	c, _ := client.Dial(f.srv.Path())
	for _, p := range []string{"a", "b", "a"} {
		if _, err := c.Acquire(p); err != nil {
			t.Fatal(err)
		}
	}
	if got := f.srv.Stats().LeasesActive; got != 3 {
		t.Fatalf("leases %d, want 3", got)
	}
	c.Close()
	f.waitClosed(t, 1)
	if st := f.srv.Stats(); st.LeasesActive != 0 || f.cache.Stats().LeasesActive != 0 {
		t.Fatalf("leases not released when the connection closed: %+v", st)
	}
}

// TestPrivateSharing: a shared lease maps the daemon's copy (the same
// memfds), a private one its own (other memfds), and only private
// mappings are writable.
func TestPrivateSharing(t *testing.T) {
	for _, sharing := range []string{ipc.SharingShared, ipc.SharingPrivate} {
		t.Run(sharing, func(t *testing.T) {
			f := newFixture(t, sharing)
			data := pattern(100000, 3)
			f.write(t, "a", data)
			r1, r2 := dial(t, f.srv.Path()), dial(t, f.srv.Path())
			a1, fd1 := r1.do(proto.Request{Op: proto.OpAcquire, Path: "a"})
			a2, fd2 := r2.do(proto.Request{Op: proto.OpAcquire, Path: "a"})
			if !a1.OK || !a2.OK || len(fd1) != 2 || len(fd2) != 2 {
				t.Fatalf("acquires: %+v %+v", a1, a2)
			}
			same := inode(t, fd1[0]) == inode(t, fd2[0])
			if same != (sharing == ipc.SharingShared) {
				t.Fatalf("%s: two leases share memfd inodes: %v", sharing, same)
			}
			if a1.Sharing != sharing || a1.Cache != (sharing == ipc.SharingShared) {
				t.Fatalf("answer: sharing %q cache %v", a1.Sharing, a1.Cache)
			}
			c, _ := client.Dial(f.srv.Path())
			defer c.Close()
			l, err := c.Acquire("a")
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			if l.ReadOnly() != (sharing == ipc.SharingShared) || !bytes.Equal(leaseBytes(t, l), data) {
				t.Fatalf("%s lease: read-only %v", sharing, l.ReadOnly())
			}
		})
	}
}

func TestSocketInUse(t *testing.T) {
	f := newFixture(t, ipc.SharingShared)
	o := testOptions("shared")
	o.Socket = f.srv.Path()
	_, err := ipc.Listen(ipc.Config{Source: f.src, Cache: f.cache, Options: o})
	if err == nil || !strings.Contains(err.Error(), "in use by another daemon") {
		t.Fatalf("second listener on a live socket: %v", err)
	}
}

func TestEpochChangesWithDaemon(t *testing.T) {
	a := newFixture(t, ipc.SharingShared)
	b := newFixture(t, ipc.SharingShared)
	if a.srv.Epoch() == b.srv.Epoch() || a.srv.Epoch() == 0 {
		t.Fatalf("epochs %d and %d", a.srv.Epoch(), b.srv.Epoch())
	}
}

func TestSocketMode(t *testing.T) {
	f := newFixture(t, ipc.SharingShared)
	st, err := os.Stat(f.srv.Path())
	if err != nil || st.Mode()&os.ModeSocket == 0 || st.Mode().Perm() != 0o666 {
		t.Fatalf("socket %v, %v: want a socket, mode 0666", st.Mode(), err)
	}
}

// TestObserve: Config.Observe sees every answered request, with the
// errno of a failure.
func TestObserve(t *testing.T) {
	type obs struct {
		op    string
		errno string
	}
	got := make(chan obs, 16)
	g := start(t, ipc.SharingShared, setup{observe: func(op string, d time.Duration, err error) {
		o := obs{op: op}
		if err != nil {
			var e interface{ Errno() string }
			if errors.As(err, &e) {
				o.errno = e.Errno()
			}
		}
		if d < 0 {
			o.errno = "negative duration"
		}
		got <- o
	}})
	g.write(t, "a", pattern(10, 1))
	r := dial(t, g.srv.Path())
	r.do(proto.Request{Op: proto.OpStat, Path: "a"})
	r.do(proto.Request{Op: proto.OpAcquire, Path: "nope"})
	r.doLine([]byte("junk\n"))
	r.do(proto.Request{Op: proto.OpReport, Event: proto.EventFallback, Reason: "x"})
	want := []obs{{"stat", ""}, {"acquire", "ENOENT"}, {"invalid", "EINVAL"}, {"report", ""}}
	for i, w := range want {
		select {
		case o := <-got:
			if o != w {
				t.Errorf("observation %d: %+v, want %+v", i, o, w)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("observation %d missing", i)
		}
	}
	if st := g.srv.Stats(); st.AutoloadFallbacks != 1 || st.AutoloadFallbackReasons["x"] != 1 {
		t.Fatalf("report not counted: %+v", st)
	}
}
