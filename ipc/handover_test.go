package ipc_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gdsfs/gdsfs/client"
	"github.com/gdsfs/gdsfs/ipc"
	"github.com/gdsfs/gdsfs/proto"
	"github.com/gdsfs/gdsfs/staging"
)

// handOver hands f's server to a successor on a new cache of the same
// SOURCE, the state through JSON: the cache has the files resident (a
// hand-over of the staging cache would have them). The successor is
// adopted and returned, not served; files handed over are closed.
func handOver(t *testing.T, f *fixture, resident ...string) (*ipc.Server, *staging.Cache) {
	t.Helper()
	st, files, err := f.srv.Handoff()
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, fl := range files {
			fl.Close()
		}
	}()
	sent(files)
	b, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	var back ipc.IPCState
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	cache := newCache(t, f.src, setup{capacity: 64 << 20, chunk: 64 << 10}, f.cfg.Log)
	t.Cleanup(func() { cache.Close() })
	for _, rel := range resident {
		l, err := cache.Acquire(context.Background(), staging.Request{Rel: rel})
		if err != nil {
			t.Fatal(err)
		}
		l.Release()
	}
	cfg := f.cfg
	cfg.Cache = cache
	srv, err := ipc.Adopt(cfg, back, files)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return srv, cache
}

// sent does to files what sending them (SCM_RIGHTS) does: Fd puts each
// in blocking mode, with the description the server's descriptor shares.
func sent(files []*os.File) {
	for _, fl := range files {
		fl.Fd()
	}
}

// TestHandoverKeepsLeasesAndConnections: a successor adopting the server
// answers on the same socket and connections: a lease held before is
// released through it and counted, an idle connection's next request and
// one sent during the switch are answered, a client connecting during
// the switch is answered; the epoch, the lease ids, the per-uid
// accounting and the counters go on.
func TestHandoverKeepsLeasesAndConnections(t *testing.T) {
	f := newFixture(t, ipc.SharingShared)
	data := pattern(300000, 1)
	f.write(t, "a", data)
	f.write(t, "b", pattern(5000, 2))
	holder, err := client.Dial(f.srv.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	l, err := holder.Acquire("a")
	if err != nil {
		t.Fatal(err)
	}
	idle := dial(t, f.srv.Path())
	if resp, _ := idle.do(proto.Request{Op: proto.OpHello, Version: proto.Version}); !resp.OK {
		t.Fatalf("hello: %+v", resp)
	}
	busy := dial(t, f.srv.Path())
	if resp, _ := busy.do(proto.Request{Op: proto.OpHello, Version: proto.Version}); !resp.OK {
		t.Fatalf("hello: %+v", resp)
	}
	uid := uint32(os.Getuid())
	before, useBefore := f.srv.Stats(), ipc.UseOf(f.srv, uid)
	epoch := f.srv.Epoch()

	st, files, err := f.srv.Handoff()
	if err != nil {
		t.Fatal(err)
	}
	for _, fl := range files {
		fl.Close()
	}
	if err := f.srv.Resume(); err != nil { // a first try that failed
		t.Fatal(err)
	}
	if st.Epoch != epoch || len(st.Conns) != 3 {
		t.Fatalf("state: epoch %d (server's %d), %d connections; want 3", st.Epoch, epoch, len(st.Conns))
	}

	// During the switch: a request on an open connection, half of one on
	// another (its end comes later), and a new client.
	b, cache := handOver(t, f, "a")
	busy.c.Write(line(proto.Request{Op: proto.OpStat, Path: "b"}))
	half := line(proto.Request{Op: proto.OpStat, Path: "a"})
	idle.c.Write(half[:5])
	late := dial(t, f.srv.Path())
	late.c.Write(line(proto.Request{Op: proto.OpHello, Version: proto.Version}))
	f.srv.Abandon()
	if _, err := os.Lstat(f.cfg.Options.Socket); err != nil {
		t.Fatalf("the socket's path after Abandon: %v", err)
	}
	closed := make(chan struct{}, 10)
	ipc.OnConnClosed(b, func() { closed <- struct{}{} })
	go b.Serve()

	for name, r := range map[string]*raw{"a connection's request sent during the switch": busy, "a client that connected during the switch": late} {
		if resp, _ := r.next(); !resp.OK || resp.Epoch != epoch {
			t.Fatalf("%s: %+v; want answered with epoch %d", name, resp, epoch)
		}
	}
	idle.c.Write(half[5:])
	if resp, _ := idle.next(); !resp.OK || resp.State != proto.StateResident || resp.Epoch != epoch {
		t.Fatalf("a request half sent before the switch: %+v", resp)
	}
	if b.Epoch() != epoch {
		t.Fatalf("successor's epoch %d, predecessor's %d", b.Epoch(), epoch)
	}
	after := b.Stats()
	if after.HeldBytes != before.HeldBytes || after.HeldFiles != 1 || after.LeasesActive != 1 || after.HoldingConnections != 1 ||
		after.OpenConnections != 4 || after.Connections != before.Connections+1 || after.Requests != before.Requests+3 {
		t.Fatalf("successor's stats %+v; predecessor's %+v", after, before)
	}
	if got := ipc.UseOf(b, uid); got.Bytes != useBefore.Bytes || got.Files != useBefore.Files || got.Leases != useBefore.Leases || got.Conns != useBefore.Conns+1 {
		t.Fatalf("uid %d in the successor: %+v; in the predecessor %+v (one connection fewer)", uid, got, useBefore)
	}
	if got := cache.Stats().LeasesActive; got != 1 {
		t.Fatalf("the successor's cache has %d leases; want the held file pinned", got)
	}
	if !bytes.Equal(leaseBytes(t, l), data) {
		t.Fatal("the lease's bytes changed")
	}

	if resp, _ := idle.do(proto.Request{Op: proto.OpAcquire, Path: "b"}); !resp.OK || resp.Lease <= st.NextLease {
		t.Fatalf("a new lease: %+v; want an id after %d", resp, st.NextLease)
	}
	l.Close()
	if _, err := holder.Stat("a"); err != nil { // after the release's answer
		t.Fatal(err)
	}
	if got := ipc.UseOf(b, uid); got.Leases != 1 || b.Stats().LeasesActive != 1 {
		t.Fatalf("after the release through the successor: uid %+v, stats %+v; want the new lease alone", got, b.Stats())
	}
	holder.Close()
	idle.c.Close()
	for range 2 {
		<-closed
	}
	if got, st := ipc.UseOf(b, uid), b.Stats(); got.Bytes != 0 || got.Files != 0 || got.Leases != 0 || st.HeldBytes != 0 || st.LeasesActive != 0 {
		t.Fatalf("every holder closed: uid %+v, stats %+v; want nothing held", got, st)
	}
	if got := cache.Stats().LeasesActive; got != 0 {
		t.Fatalf("the successor's cache has %d leases; want none", got)
	}
}

// TestHandoverResume: a server handed off and resumed answers what was
// sent meanwhile and new clients, and can be handed off again.
func TestHandoverResume(t *testing.T) {
	f := newFixture(t, ipc.SharingShared)
	f.write(t, "a", pattern(1000, 1))
	r := dial(t, f.srv.Path())
	if resp, _ := r.do(proto.Request{Op: proto.OpAcquire, Path: "a"}); !resp.OK {
		t.Fatalf("acquire: %+v", resp)
	}
	for range 2 {
		_, files, err := f.srv.Handoff()
		if err != nil {
			t.Fatal(err)
		}
		sent(files)
		for _, fl := range files {
			fl.Close()
		}
		if _, _, err := f.srv.Handoff(); err == nil {
			t.Fatal("a second Handoff before Resume succeeded")
		}
		r.c.Write(line(proto.Request{Op: proto.OpStat, Path: "a"}))
		late := dial(t, f.srv.Path())
		late.c.Write(line(proto.Request{Op: proto.OpHello, Version: proto.Version}))
		if err := f.srv.Resume(); err != nil {
			t.Fatal(err)
		}
		if resp, _ := r.next(); !resp.OK || resp.State != proto.StateResident {
			t.Fatalf("a request sent while handed off: %+v", resp)
		}
		if resp, _ := late.next(); !resp.OK {
			t.Fatalf("a client that connected while handed off: %+v", resp)
		}
	}
	if err := f.srv.Resume(); err == nil {
		t.Fatal("Resume of a server not handed off succeeded")
	}
	if st := f.srv.Stats(); st.LeasesActive != 1 || st.HeldFiles != 1 {
		t.Fatalf("after two hand-overs undone: %+v", st)
	}
}

// TestHandoverCarriesAWait: a wait_stat blocked when the server is handed
// off is answered by the successor when its condition comes true there.
func TestHandoverCarriesAWait(t *testing.T) {
	waiting := make(chan struct{}, 10)
	f := start(t, ipc.SharingShared, setup{before: func(s *ipc.Server) { ipc.OnWaiting(s, func() { waiting <- struct{}{} }) }})
	f.write(t, "a", pattern(1000, 1))
	w := dial(t, f.srv.Path())
	w.c.Write(line(waitStatReq(proto.StatLeasesActive, 1, 60000)))
	<-waiting
	b, _ := handOver(t, f, "a")
	f.srv.Abandon()
	go b.Serve()
	if resp, _ := dial(t, f.srv.Path()).do(proto.Request{Op: proto.OpAcquire, Path: "a"}); !resp.OK {
		t.Fatalf("acquire on the successor: %+v", resp)
	}
	if resp, _ := w.next(); !resp.OK {
		t.Fatalf("the wait handed over: %+v", resp)
	}
}

// TestHandoverUndoesACutAcquire: an acquire_many that was granted its
// first file and waits for room for the second when the server is handed
// off is handed over whole: the first grant is undone, and the successor
// answers both once there is room.
func TestHandoverUndoesACutAcquire(t *testing.T) {
	waiting := make(chan struct{}, 10)
	f := start(t, ipc.SharingShared, setup{
		opts:   func(o *ipc.Options) { o.MaxHeldPerUID.Percent, o.MaxHeldPerUID.Bytes = 0, 128<<10 },
		before: func(s *ipc.Server) { ipc.OnWaiting(s, func() { waiting <- struct{}{} }) },
	})
	for _, p := range []string{"x", "y", "z"} {
		f.write(t, p, pattern(64<<10, len(p)))
	}
	hog := dial(t, f.srv.Path())
	if resp, _ := hog.do(proto.Request{Op: proto.OpAcquire, Path: "x"}); !resp.OK {
		t.Fatalf("acquire x: %+v", resp)
	}
	m := dial(t, f.srv.Path())
	m.c.Write(line(proto.Request{Op: proto.OpAcquireMany, Paths: []string{"y", "z"}}))
	<-waiting // y granted, z waits for the uid's room
	b, _ := handOver(t, f, "x", "y", "z")
	f.srv.Abandon()
	uid := uint32(os.Getuid())
	if got := ipc.UseOf(b, uid); got.Files != 1 || got.Bytes != 64<<10 || got.Leases != 1 {
		t.Fatalf("successor's accounting: %+v; want x alone (y's grant undone)", got)
	}
	go b.Serve()
	hog.c.Close()
	resp, _ := m.next()
	if !resp.OK || len(resp.Files) != 2 || !resp.Files[0].OK || !resp.Files[1].OK {
		t.Fatalf("the acquire_many handed over: %+v", resp)
	}
	if got := ipc.UseOf(b, uid); got.Files != 2 || got.Leases != 2 {
		t.Fatalf("after it: %+v; want y and z held", got)
	}
}

// TestAdoptRefusesUnknownVersion: a state of another version is refused,
// naming both versions.
func TestAdoptRefusesUnknownVersion(t *testing.T) {
	f := newFixture(t, ipc.SharingShared)
	st, files, err := f.srv.Handoff()
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, fl := range files {
			fl.Close()
		}
		f.srv.Resume()
	}()
	st.Version = 999
	_, err = ipc.Adopt(f.cfg, st, files)
	if err == nil || !strings.Contains(err.Error(), "999") || !strings.Contains(err.Error(), "version 1") {
		t.Fatalf("adopting version 999: %v; want refused naming 999 and 1", err)
	}
}

// TestHandoverDropsAFileNotResident: a held file the successor's cache
// does not have is no longer counted; its lease id is still released
// through the successor, and the consumer's mapping stays right.
func TestHandoverDropsAFileNotResident(t *testing.T) {
	f := newFixture(t, ipc.SharingShared)
	data := pattern(100000, 3)
	f.write(t, "a", data)
	f.write(t, "b", pattern(1000, 4))
	holder, err := client.Dial(f.srv.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	la, err := holder.Acquire("a")
	if err != nil {
		t.Fatal(err)
	}
	lb, err := holder.Acquire("b")
	if err != nil {
		t.Fatal(err)
	}
	b, cache := handOver(t, f, "b") // a is not resident there
	f.srv.Abandon()
	go b.Serve()
	uid := uint32(os.Getuid())
	if got := ipc.UseOf(b, uid); got.Files != 1 || got.Bytes != 4096 || got.Leases != 2 {
		t.Fatalf("successor's accounting: %+v; want b's 4 KiB alone held, both lease ids", got)
	}
	if state, _ := cache.Attr("a"); state != proto.StateAbsent {
		t.Fatalf("a in the successor's cache: %s; want it not loaded again", state)
	}
	if !bytes.Equal(leaseBytes(t, la), data) {
		t.Fatal("the dropped file's mapping changed")
	}
	la.Close()
	lb.Close()
	if _, err := holder.Stat("a"); err != nil { // after the releases' answers
		t.Fatal(err)
	}
	if got := ipc.UseOf(b, uid); got.Leases != 0 || got.Files != 1 {
		t.Fatalf("after both releases: %+v; want no lease ids, b still held", got)
	}
}

// TestAdoptOnAnotherSocket: a successor whose ipc.socket names another
// path listens there and still serves the connections handed over.
func TestAdoptOnAnotherSocket(t *testing.T) {
	f := newFixture(t, ipc.SharingShared)
	f.write(t, "a", pattern(1000, 1))
	r := dial(t, f.srv.Path())
	if resp, _ := r.do(proto.Request{Op: proto.OpAcquire, Path: "a"}); !resp.OK {
		t.Fatalf("acquire: %+v", resp)
	}
	st, files, err := f.srv.Handoff()
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, fl := range files {
			fl.Close()
		}
	}()
	cfg := f.cfg
	cfg.Options.Socket = f.cfg.Options.Socket + ".new"
	b, err := ipc.Adopt(cfg, st, files)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	f.srv.Abandon()
	go b.Serve()
	if b.Path() != cfg.Options.Socket {
		t.Fatalf("successor's socket %s; want %s", b.Path(), cfg.Options.Socket)
	}
	if resp, _ := r.do(proto.Request{Op: proto.OpStat, Path: "a"}); !resp.OK || resp.Epoch != st.Epoch {
		t.Fatalf("a connection handed over: %+v", resp)
	}
	if resp, _ := dial(t, b.Path()).do(proto.Request{Op: proto.OpHello, Version: proto.Version}); !resp.OK {
		t.Fatalf("a new client on the new socket: %+v", resp)
	}
	if got := b.Stats(); got.HeldFiles != 1 || got.LeasesActive != 1 {
		t.Fatalf("successor's stats %+v; want the lease and its file (resident in the same cache)", got)
	}
}

// TestHandoverFailedSuccessor: a successor closed before it served (the
// hand-over failed further on) leaves the socket's path, the connections
// and the leases to the predecessor, which resumes.
func TestHandoverFailedSuccessor(t *testing.T) {
	f := newFixture(t, ipc.SharingShared)
	f.write(t, "a", pattern(1000, 1))
	r := dial(t, f.srv.Path())
	if resp, _ := r.do(proto.Request{Op: proto.OpAcquire, Path: "a"}); !resp.OK {
		t.Fatalf("acquire: %+v", resp)
	}
	before := f.srv.Stats()
	b, cache := handOver(t, f, "a")
	r.c.Write(line(proto.Request{Op: proto.OpStat, Path: "a"}))
	b.Close()
	if got := cache.Stats().LeasesActive; got != 0 {
		t.Fatalf("the closed successor's cache has %d leases; want none", got)
	}
	if err := f.srv.Resume(); err != nil {
		t.Fatal(err)
	}
	if resp, _ := r.next(); !resp.OK || resp.Epoch != f.srv.Epoch() {
		t.Fatalf("a request sent during the failed hand-over: %+v", resp)
	}
	if resp, _ := dial(t, f.cfg.Options.Socket).do(proto.Request{Op: proto.OpHello, Version: proto.Version}); !resp.OK {
		t.Fatalf("a new client after the failed hand-over: %+v", resp)
	}
	if got := f.srv.Stats(); got.HeldBytes != before.HeldBytes || got.LeasesActive != 1 {
		t.Fatalf("predecessor's stats %+v; before %+v", got, before)
	}
}

// TestHandoverPrivate: private copies handed over (two of one file on
// one connection) stay counted and end with their connection, and a new
// acquire of the file gets a copy of its own.
func TestHandoverPrivate(t *testing.T) {
	f := newFixture(t, ipc.SharingPrivate)
	f.write(t, "a", pattern(100000, 1))
	r := dial(t, f.srv.Path())
	for range 2 {
		if resp, fds := r.do(proto.Request{Op: proto.OpAcquire, Path: "a"}); !resp.OK || len(fds) == 0 {
			t.Fatalf("acquire: %+v", resp)
		}
	}
	uid := uint32(os.Getuid())
	before := ipc.UseOf(f.srv, uid)
	b, cache := handOver(t, f, "a")
	f.srv.Abandon()
	closed := make(chan struct{}, 1)
	ipc.OnConnClosed(b, func() { closed <- struct{}{} })
	go b.Serve()
	if got := ipc.UseOf(b, uid); got != before || got.Files != 2 {
		t.Fatalf("successor's accounting %+v; predecessor's %+v", got, before)
	}
	resp, fds := r.do(proto.Request{Op: proto.OpAcquire, Path: "a"})
	if !resp.OK || resp.Reuse || len(fds) == 0 {
		t.Fatalf("a third private lease: %+v with %d descriptors; want a copy of its own", resp, len(fds))
	}
	if got := ipc.UseOf(b, uid); got.Files != 3 || got.Bytes != before.Bytes*3/2 {
		t.Fatalf("after a third private lease: %+v", got)
	}
	r.c.Close()
	<-closed
	if got, n := ipc.UseOf(b, uid), cache.Stats().LeasesActive; got != (ipc.Use{}) || n != 0 {
		t.Fatalf("the connection closed: %+v, %d leases in the cache; want nothing", got, n)
	}
}

// TestAdoptChecksThePeer: a connection whose descriptor's peer is not the
// one its state names is not adopted: it ends, and nothing of it counts.
func TestAdoptChecksThePeer(t *testing.T) {
	f := newFixture(t, ipc.SharingShared)
	f.write(t, "a", pattern(1000, 1))
	r := dial(t, f.srv.Path())
	if resp, _ := r.do(proto.Request{Op: proto.OpAcquire, Path: "a"}); !resp.OK {
		t.Fatalf("acquire: %+v", resp)
	}
	st, files, err := f.srv.Handoff()
	if err != nil {
		t.Fatal(err)
	}
	st.Conns[0].UID += 4242
	b, err := ipc.Adopt(f.cfg, st, files)
	for _, fl := range files {
		fl.Close()
	}
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	f.srv.Abandon()
	go b.Serve()
	if got := b.Stats(); got.OpenConnections != 0 || got.LeasesActive != 0 || got.HeldFiles != 0 {
		t.Fatalf("successor's stats %+v; want the connection not adopted", got)
	}
	r.c.SetReadDeadline(time.Now().Add(20 * time.Second))
	if n, err := r.c.Read(make([]byte, 1)); n != 0 || !errors.Is(err, io.EOF) {
		t.Fatalf("the connection not adopted: read %d bytes, %v; want it ended", n, err)
	}
}
