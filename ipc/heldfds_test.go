package ipc_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/gdsfs/gdsfs/ipc"
	"github.com/gdsfs/gdsfs/proto"
)

// openFDs is the number of descriptors this process has open.
func openFDs(t *testing.T) int {
	t.Helper()
	es, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(es)
}

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
	before := openFDs(t) // the staged files' own, and no connection
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
	if got := openFDs(t) - before; got > 4 {
		t.Errorf("holding %d files over one connection keeps %d more descriptors open", n, got)
	}
}
