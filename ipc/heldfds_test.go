package ipc_test

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/gdsfs/gdsfs/internal/testkit/testfiles"
	"github.com/gdsfs/gdsfs/ipc"
	"github.com/gdsfs/gdsfs/proto"
)

// TestHeldFilesKeepNoDescriptors: the descriptors of a grant are the
// peer's once sent; the server keeps none per file a connection holds
// (an unprivileged peer holding every staged file would otherwise add a
// descriptor per chunk to those staging counts, past the reserve its
// budget leaves, and the server, the mount and every other user would
// get EMFILE).
func TestHeldFilesKeepNoDescriptors(t *testing.T) {
	f := newFixture(t, ipc.SharingShared)
	const n = 64
	paths := make([]string, n)
	for i := range paths {
		paths[i] = fmt.Sprintf("h%d", i)
		f.write(t, paths[i], pattern(4096, i))
	}
	stage := dial(t, f.cfg.Options.Socket)
	if resp, files := stage.do(proto.Request{Op: proto.OpAcquireMany, Paths: paths}); !resp.OK || len(files) != n {
		t.Fatalf("staging %d files: %+v, %d descriptors", n, resp, len(files))
	}
	stage.c.Close()
	f.waitClosed(t, 1)
	before := testfiles.OpenFDs(t) // the staged files' own, and no connection
	c := dial(t, f.cfg.Options.Socket)
	resp, files := c.do(proto.Request{Op: proto.OpAcquireMany, Paths: paths})
	if !resp.OK || len(files) != n {
		t.Fatalf("holding %d files: %+v, %d descriptors", n, resp, len(files))
	}
	for _, fl := range files {
		fl.Close()
	}
	// the server closes its copies after the answer, before it reads the
	// next request: one answered on the same connection comes after that
	if resp, _ := c.do(proto.Request{Op: proto.OpHello}); !resp.OK {
		t.Fatalf("hello: %+v", resp)
	}
	if st := f.srv.Stats(); st.HeldFiles != n {
		t.Fatalf("%d files held, want %d", st.HeldFiles, n)
	}
	// the connection's two ends, and slack for the runtime (an epoll
	// descriptor, a pipe): nothing per file
	if got := testfiles.OpenFDs(t) - before; got > 4 {
		t.Errorf("holding %d files over one connection keeps %d more descriptors open", n, got)
	}
}

// TestRepeatedPathExportedOnce: an acquire_many naming one file many
// times makes the server duplicate its descriptors once, not once per
// item: otherwise one request line of an unprivileged peer (up to
// ipc.max_leases_per_uid items) has the server hold a descriptor per
// item and chunk while the answer is sent, which a peer that does not
// read keeps for ipc.request_timeout.
func TestRepeatedPathExportedOnce(t *testing.T) {
	const n = 200
	counted := make(chan int, 1)
	f := start(t, ipc.SharingShared, setup{
		opts: func(o *ipc.Options) { o.MaxRequest = 64 << 10 },
		observe: func(op string, d time.Duration, err error) {
			if op == proto.OpAcquireMany {
				// the answer is sent, its descriptors still the server's
				// to close; the peer has read none of them yet
				es, err := os.ReadDir("/proc/self/fd")
				if err != nil {
					es = nil // reported below as a count of 0
				}
				counted <- len(es)
			}
		},
	})
	f.write(t, "a", pattern(4096, 1))
	stage := dial(t, f.cfg.Options.Socket)
	if resp, files := stage.do(proto.Request{Op: proto.OpAcquire, Path: "a"}); !resp.OK || len(files) != 1 {
		t.Fatalf("staging a: %+v, %d descriptors", resp, len(files))
	}
	stage.c.Close()
	f.waitClosed(t, 1)
	before := testfiles.OpenFDs(t)
	paths := make([]string, n)
	for i := range paths {
		paths[i] = "a"
	}
	c := dial(t, f.cfg.Options.Socket)
	req := proto.Request{Op: proto.OpAcquireMany, Paths: paths}
	if _, err := c.c.Write(req.Line()); err != nil {
		t.Fatal(err)
	}
	during := <-counted
	if during == 0 {
		t.Fatal("could not count the descriptors open while the answer was sent")
	}
	resp, files := c.next()
	if !resp.OK || len(files) != n {
		t.Fatalf("acquire_many of a %d times: %+v, %d descriptors", n, resp, len(files))
	}
	// the connection's two ends, one copy of a's chunk, and slack for
	// the runtime (an epoll descriptor, a pipe)
	if got := during - before; got > 5 {
		t.Errorf("an answer naming one file %d times had the server hold %d more descriptors", n, got)
	}
}
