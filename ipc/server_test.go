package ipc_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/gdsfs/gdsfs/client"
	"github.com/gdsfs/gdsfs/gpu"
	"github.com/gdsfs/gdsfs/gpu/host"
	"github.com/gdsfs/gdsfs/internal/units"
	"github.com/gdsfs/gdsfs/ipc"
	"github.com/gdsfs/gdsfs/staging"
)

type fixture struct {
	src   string
	cache *staging.Cache
	srv   *ipc.Server
}

func newFixture(t *testing.T, sharing string) *fixture {
	t.Helper()
	src := t.TempDir()
	log := zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
	cache, err := staging.New(context.Background(), staging.Config{
		Source: src,
		Options: staging.Options{Device: "host", GPUs: []int{0}, Capacity: units.Share{Bytes: 64 << 20},
			ChunkSize: 64 << 10, Prefetch: "open", PrefetchQueue: 16, PrefetchWorkers: 1},
		IO:      staging.IOOptions{CompatMode: "auto", TaskSize: 64 << 10, BounceSize: 64 << 10, NumThreads: 2, DirectIO: "off"},
		Devices: []gpu.Device{host.Open(gpu.Options{ChunkSize: 64 << 10})},
		Log:     log,
	})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := ipc.Listen(ipc.Config{
		Source: src, Mountpoint: "/mnt/gds", Cache: cache, Log: log,
		Options: ipc.Options{Socket: filepath.Join(t.TempDir(), "s.sock"), Sharing: sharing,
			AcquireTimeout: 10 * time.Second, MaxRequest: 1024, MaxConnections: 8},
	})
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve()
	t.Cleanup(func() {
		srv.Close()
		cache.Close()
	})
	return &fixture{src: src, cache: cache, srv: srv}
}

func (f *fixture) write(t *testing.T, rel string, data []byte) {
	t.Helper()
	os.MkdirAll(filepath.Dir(filepath.Join(f.src, rel)), 0o755)
	if err := os.WriteFile(filepath.Join(f.src, rel), data, 0o644); err != nil {
		t.Fatal(err)
	}
}

func pattern(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + i>>8)
	}
	return b
}

func leaseBytes(t *testing.T, l *client.Lease) []byte {
	t.Helper()
	b := make([]byte, l.Size())
	if _, err := l.ReadAt(b, 0); err != nil {
		t.Fatal(err)
	}
	return b
}

func TestAcquireReadRelease(t *testing.T) {
	f := newFixture(t, ipc.SharingShared)
	data := pattern(300000) // five 64 KiB chunks
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
		if got := f.cache.Stats().LeasesActive; got != 1 {
			t.Fatalf("leases active %d, want 1", got)
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		if got := f.cache.Stats().LeasesActive; got != 0 {
			t.Fatalf("leases active after close %d", got)
		}
	}
	st, err := c.Stat("d/x.bin")
	if err != nil || st.State != "resident" || st.Size != int64(len(data)) || st.LoadPath != "host" {
		t.Fatalf("stat: %+v %v", st, err)
	}
	for p, want := range map[string]syscall.Errno{"missing": syscall.ENOENT, "d": syscall.EINVAL, "": syscall.EINVAL} {
		if _, err := c.Acquire(p); !errors.Is(err, want) {
			t.Errorf("acquire %q: %v, want %v", p, err, want)
		}
	}
}

func TestClosingConnectionReleases(t *testing.T) {
	f := newFixture(t, ipc.SharingShared)
	f.write(t, "a", pattern(1000))
	f.write(t, "b", pattern(2000))
	c, _ := client.Dial(f.srv.Path())
	for _, p := range []string{"a", "b", "a"} {
		if _, err := c.Acquire(p); err != nil {
			t.Fatal(err)
		}
	}
	if got := f.cache.Stats().LeasesActive; got != 3 {
		t.Fatalf("leases %d, want 3", got)
	}
	c.Close()
	deadline := time.Now().Add(5 * time.Second)
	for f.cache.Stats().LeasesActive != 0 {
		if time.Now().After(deadline) {
			t.Fatal("leases not released when the connection closed")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// raw sends lines on a plain connection and returns the answers.
func raw(t *testing.T, path string, lines ...string) []ipc.Response {
	t.Helper()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var out []ipc.Response
	r := bufio.NewReader(c)
	for _, l := range lines {
		c.Write([]byte(l))
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		line, err := r.ReadBytes('\n')
		if err != nil {
			break
		}
		var resp ipc.Response
		json.Unmarshal(line, &resp)
		out = append(out, resp)
	}
	return out
}

func TestBadRequestsAreAnswered(t *testing.T) {
	f := newFixture(t, ipc.SharingShared)
	f.write(t, "a", pattern(10))
	got := raw(t, f.srv.Path(),
		"not json\n",
		`{"op":"fly"}`+"\n",
		`{"op":"acquire","path":"a","extra":1}`+"\n",
		`{"op":"release","lease":99}`+"\n",
		`{"op":"release","lease":1,"epoch":12345}`+"\n",
		`{"op":"stat","path":"a"}`+"\n",
		`{"op":"acquire","path":"`+strings.Repeat("x", 2000)+`"}`+"\n",
		`{"op":"stat","path":"a"}`+"\n", // the connection was closed after the oversized line
	)
	want := []string{"EINVAL", "EINVAL", "EINVAL", "EINVAL", "ESTALE", "", "E2BIG"}
	if len(got) != len(want) {
		t.Fatalf("%d answers, want %d: %+v", len(got), len(want), got)
	}
	for i, w := range want {
		if got[i].Errno != w || got[i].OK != (w == "") || got[i].Epoch != f.srv.Epoch() {
			t.Errorf("answer %d: %+v, want errno %q and epoch %d", i, got[i], w, f.srv.Epoch())
		}
	}
	if s := f.srv.Stats(); s.BadRequests < 4 {
		t.Errorf("bad requests counted %d", s.BadRequests)
	}
}

func TestHalfRequestDoesNotStallOthers(t *testing.T) {
	f := newFixture(t, ipc.SharingShared)
	f.write(t, "a", pattern(5000))
	half, err := net.Dial("unix", f.srv.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer half.Close()
	half.Write([]byte(`{"op":"acq`)) // and never the rest
	done := make(chan error, 1)
	go func() {
		c, err := client.Dial(f.srv.Path())
		if err != nil {
			done <- err
			return
		}
		defer c.Close()
		l, err := c.Acquire("a")
		if err == nil {
			err = l.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a half request stalled another client")
	}
}

func TestTooManyConnections(t *testing.T) {
	f := newFixture(t, ipc.SharingShared)
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range 8 {
		c, _ := net.Dial("unix", f.srv.Path())
		conns = append(conns, c)
	}
	time.Sleep(50 * time.Millisecond) // let the server register them
	got := raw(t, f.srv.Path(), `{"op":"stat","path":"x"}`+"\n")
	if len(got) != 1 || got[0].Errno != "EMFILE" {
		t.Fatalf("ninth connection: %+v, want EMFILE", got)
	}
}

func TestPrivateSharing(t *testing.T) {
	f := newFixture(t, ipc.SharingPrivate)
	data := pattern(100000)
	f.write(t, "a", data)
	c, _ := client.Dial(f.srv.Path())
	defer c.Close()
	l1, err := c.Acquire("a")
	if err != nil {
		t.Fatal(err)
	}
	l2, err := c.Acquire("a")
	if err != nil {
		t.Fatal(err)
	}
	if l1.Ptr() == l2.Ptr() || !bytes.Equal(leaseBytes(t, l1), data) || !bytes.Equal(leaseBytes(t, l2), data) {
		t.Fatal("private leases must be equal copies, not one view")
	}
	l1.Close()
	l2.Close()
}

func TestSocketInUse(t *testing.T) {
	f := newFixture(t, ipc.SharingShared)
	_, err := ipc.Listen(ipc.Config{Source: f.src, Cache: f.cache, Options: ipc.Options{
		Socket: f.srv.Path(), Sharing: "shared", AcquireTimeout: time.Second, MaxRequest: 1024, MaxConnections: 1}})
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
