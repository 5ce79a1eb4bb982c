package ipc_test

import (
	"context"
	"testing"

	"github.com/gdsfs/gdsfs/ipc"
	"github.com/gdsfs/gdsfs/proto"
)

// TestStatAndWaitSayWhyAbsent: an absent file that was staged
// says why it left (stat and wait answer `why`), so warmup can print it;
// once it loads again the reason is gone.
func TestStatAndWaitSayWhyAbsent(t *testing.T) {
	f := newFixture(t, ipc.SharingShared)
	f.write(t, "a", pattern(100000, 1))
	c := dial(t, f.srv.Path())
	if resp, _ := c.do(proto.Request{Op: proto.OpStat, Path: "a"}); !resp.OK || resp.State != proto.StateAbsent || resp.Why != "" {
		t.Fatalf("never staged: %+v, want absent with no reason", resp)
	}
	if _, err := f.cache.Stage(context.Background(), "a"); err != nil {
		t.Fatal(err)
	}
	if err := f.cache.Evict("a"); err != nil {
		t.Fatal(err)
	}
	resp, _ := c.do(proto.Request{Op: proto.OpWait, Path: "a", Until: []string{proto.StateAbsent}, TimeoutMS: 10000})
	if !resp.OK || resp.State != proto.StateAbsent || resp.Why != "evicted on request" {
		t.Fatalf("wait after evicting: %+v, want absent, why \"evicted on request\"", resp)
	}
	if resp, _ := c.do(proto.Request{Op: proto.OpStat, Path: "a"}); resp.Why != "evicted on request" {
		t.Fatalf("stat after evicting: %+v, want why \"evicted on request\"", resp)
	}
	if _, err := f.cache.Stage(context.Background(), "a"); err != nil {
		t.Fatal(err)
	}
	if resp, _ := c.do(proto.Request{Op: proto.OpStat, Path: "a"}); resp.State != proto.StateResident || resp.Why != "" {
		t.Fatalf("staged again: %+v, want resident with no reason", resp)
	}
	if got := f.cache.AbsentReason("a"); got != "" {
		t.Fatalf("AbsentReason of a resident file: %q", got)
	}
}
