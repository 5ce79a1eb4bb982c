package ipc_test

import (
	"testing"

	"github.com/gdsfs/gdsfs"
	"github.com/gdsfs/gdsfs/ipc"
	"github.com/gdsfs/gdsfs/proto"
)

// TestHelloAnswersReleaseWhenAsked: a hello that carries the client's
// release is answered with the daemon's; a hello without one gets the
// answer the protocol's first version gave.
func TestHelloAnswersReleaseWhenAsked(t *testing.T) {
	f := start(t, ipc.SharingShared, setup{})
	resp, _ := dial(t, f.srv.Path()).do(proto.Request{Op: proto.OpHello, Version: proto.Version, Release: "0.0.1"})
	if !resp.OK || resp.Release != gdsfs.Version || resp.Version != proto.Version {
		t.Fatalf("hello with a release: %+v, want release %q", resp, gdsfs.Version)
	}
	resp, _ = dial(t, f.srv.Path()).do(proto.Request{Op: proto.OpHello, Version: proto.Version})
	if !resp.OK || resp.Release != "" {
		t.Fatalf("hello without a release: %+v, want no release", resp)
	}
}
