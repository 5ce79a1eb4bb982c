package daemon

import (
	"io"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gdsfs/gdsfs/daemon/config"
	"github.com/gdsfs/gdsfs/internal/metrics"
)

// The adapters between the staging and ipc contracts and the histograms:
// only ends of loads count, and lease requests are labelled by errno.
func TestMetricsAdapters(t *testing.T) {
	cfg, err := config.Load("", nil)
	if err != nil {
		t.Fatal(err)
	}
	d := &daemon{cfg: cfg}
	d.metrics = metrics.New(d.liveStats) // not mounted: no counters, histograms only
	for _, e := range []loadEvent{
		{State: "loading", LoadPath: "posix", Bytes: 1e9},
		{State: "resident", LoadPath: "posix", Bytes: 1e9, Duration: time.Second},
		{State: "failed", LoadPath: "cufile", Bytes: 1e9, Duration: time.Second, Err: syscall.EIO},
		{State: "absent", LoadPath: "posix", Bytes: 1e9, Duration: time.Second},
	} {
		observeLoad(d.metrics, e)
	}
	d.observeRequest("acquire", time.Millisecond, syscall.EACCES)
	rec := httptest.NewRecorder()
	d.metrics.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body, _ := io.ReadAll(rec.Body)
	for _, want := range []string{
		`gdsfs_load_duration_seconds_count{path="posix",result="ok"} 1`,
		`gdsfs_load_duration_seconds_count{path="cufile",result="failed"} 1`,
		`gdsfs_load_gbps_count{path="posix"} 1`,
		`gdsfs_lease_request_duration_seconds_count{op="acquire",result="EACCES"} 1`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("scrape lacks %s:\n%s", want, body)
		}
	}
	if strings.Contains(string(body), `result="ok"} 2`) {
		t.Errorf("a transition that is not a load's end was counted:\n%s", body)
	}
}
