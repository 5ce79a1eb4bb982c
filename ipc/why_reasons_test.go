package ipc_test

import (
	"context"
	"strings"
	"testing"

	"github.com/gdsfs/gdsfs/ipc"
	"github.com/gdsfs/gdsfs/proto"
)

// TestWhyAbsentReasons: stat and wait name why a staged file left, for
// each way it can leave that a client can bring about: its SOURCE file
// changed, it was changed through the mount, another file needed the
// room, or it could not be staged at all.
func TestWhyAbsentReasons(t *testing.T) {
	for _, tc := range []struct {
		name string
		make func(t *testing.T, f *fixture) // leaves "a" absent
		want string                         // the why, or its start when it ends with "..."
	}{
		{"changed in SOURCE", func(t *testing.T, f *fixture) {
			stage(t, f, "a")
			f.write(t, "a", pattern(300000, 2))
		}, "changed"}, // "modified (change event)" where fanotify reports it
		{"changed through the mount", func(t *testing.T, f *fixture) {
			stage(t, f, "a")
			f.cache.Changed("a")
		}, "changed through the mount"},
		{"evicted for another file", func(t *testing.T, f *fixture) {
			stage(t, f, "a")
			f.write(t, "b", pattern(600000, 3))
			stage(t, f, "b")
		}, "evicted"},
		{"too large to stage", func(t *testing.T, f *fixture) {
			f.write(t, "a", pattern(2<<20, 4))
			if !f.cache.Prefetch("a") {
				t.Fatal("the prefetch queue refused a")
			}
		}, "not staged: ..."},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := start(t, ipc.SharingShared, setup{capacity: 1 << 20})
			f.write(t, "a", pattern(600000, 1))
			tc.make(t, f)
			if tc.want == "changed" && f.cache.Stats().ChangeDetection == "fanotify" {
				tc.want = "modified (change event)"
			}
			c := dial(t, f.srv.Path())
			resp, _ := c.do(proto.Request{Op: proto.OpWait, Path: "a", Until: []string{proto.StateAbsent}, TimeoutMS: 10000})
			if !resp.OK || resp.State != proto.StateAbsent || !whyIs(resp.Why, tc.want) {
				t.Fatalf("wait: %+v, want absent, why %q", resp, tc.want)
			}
			if resp, _ := c.do(proto.Request{Op: proto.OpStat, Path: "a"}); resp.State != proto.StateAbsent || !whyIs(resp.Why, tc.want) {
				t.Fatalf("stat: %+v, want absent, why %q", resp, tc.want)
			}
		})
	}
}

// whyIs says whether why is want (or starts with want's text before a
// trailing "...").
func whyIs(why, want string) bool {
	if p, ok := strings.CutSuffix(want, "..."); ok {
		return strings.HasPrefix(why, p) && len(why) > len(p)
	}
	return why == want
}

// stage stages rel and checks it is resident.
func stage(t *testing.T, f *fixture, rel string) {
	t.Helper()
	info, err := f.cache.Stage(context.Background(), rel)
	if err != nil {
		t.Fatal(err)
	}
	if info.State != proto.StateResident {
		t.Fatalf("%s staged as %q", rel, info.State)
	}
}
