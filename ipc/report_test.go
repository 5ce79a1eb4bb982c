package ipc_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/gdsfs/gdsfs/ipc"
	"github.com/gdsfs/gdsfs/proto"
)

func report(t *testing.T, r *raw, reason string) {
	t.Helper()
	if resp, _ := r.do(proto.Request{Op: proto.OpReport, Event: proto.EventFallback, Reason: reason}); !resp.OK {
		t.Fatalf("report %q: %+v", reason, resp)
	}
}

// TestReportsBoundedPerUID: one uid forging fallback reasons names 8 at
// most (the rest count as "other"), so the reasons of other uids are still
// counted by name; however many uids report, 64 reasons at most are kept.
func TestReportsBoundedPerUID(t *testing.T) {
	f := newFixture(t, ipc.SharingShared)
	forger := dialAs(t, f.srv.Path(), nobody, nobody)
	for i := range 20 {
		report(t, forger, fmt.Sprintf("forged-%d", i))
	}
	root := dial(t, f.srv.Path())
	report(t, root, "refused:EACCES")
	report(t, forger, "refused:EACCES") // counting a reason another uid named is fine
	report(t, root, "other")
	st := f.srv.Stats()
	if got := st.AutoloadFallbackReasons["refused:EACCES"]; got != 2 {
		t.Errorf("refused:EACCES counted %d, want 2 (reasons %v)", got, st.AutoloadFallbackReasons)
	}
	named := 0
	for k := range st.AutoloadFallbackReasons {
		if strings.HasPrefix(k, "forged-") {
			named++
		}
	}
	if named != 8 || st.AutoloadFallbackReasons["other"] != 12+1 {
		t.Errorf("uid %d named %d reasons, other %d; want 8 and 13 (reasons %v)", nobody, named, st.AutoloadFallbackReasons["other"], st.AutoloadFallbackReasons)
	}
	if st.AutoloadFallbacks != 20+3 {
		t.Errorf("autoload_fallbacks %d, want 23", st.AutoloadFallbacks)
	}
	for uid := uint32(1000); uid < 1010; uid++ {
		r := dialAs(t, f.srv.Path(), uid, uid)
		for i := range 8 {
			report(t, r, fmt.Sprintf("uid-%d-%d", uid, i))
		}
	}
	if n := len(f.srv.Stats().AutoloadFallbackReasons); n != 64 {
		t.Errorf("%d reasons kept, want 64 (the bound, \"other\" included)", n)
	}
}
