package metrics

import (
	"fmt"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.uber.org/zap"
)

// scrape serves m, fetches /metrics over HTTP and parses it with the
// Prometheus text parser.
func scrape(t *testing.T, m *Metrics) map[string]*dto.MetricFamily {
	t.Helper()
	if err := m.Serve("127.0.0.1:0", zap.NewNop()); err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	resp, err := http.Get("http://" + m.Addr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse the scrape: %v", err)
	}
	return fams
}

func TestStatsServedAsMetrics(t *testing.T) {
	stats := map[string]any{
		"opens": float64(7), "resident_bytes": float64(1 << 20), "leases_total": float64(3),
		"passthrough": true, "cufile_mode": "unavailable: host backend", "device": "host",
		"new_counter_nobody_knows":  float64(5),
		"autoload_fallback_reasons": map[string]any{"pickle": float64(2), "sharded": float64(1)},
	}
	fams := scrape(t, New(func() map[string]any { return stats }))
	for _, tc := range []struct {
		name string
		typ  dto.MetricType
		want float64
	}{
		{"gdsfs_opens_total", dto.MetricType_COUNTER, 7},
		{"gdsfs_resident_bytes", dto.MetricType_GAUGE, 1 << 20},
		{"gdsfs_leases_total", dto.MetricType_COUNTER, 3},
		{"gdsfs_passthrough", dto.MetricType_GAUGE, 1},
		{"gdsfs_new_counter_nobody_knows", dto.MetricType_UNTYPED, 5},
	} {
		f := fams[tc.name]
		if f == nil {
			t.Errorf("%s not served", tc.name)
			continue
		}
		if f.GetType() != tc.typ {
			t.Errorf("%s is %v, want %v", tc.name, f.GetType(), tc.typ)
		}
		if got := value(f.Metric[0]); got != tc.want {
			t.Errorf("%s = %v, want %v", tc.name, got, tc.want)
		}
	}
	info := fams["gdsfs_info"]
	if info == nil {
		t.Fatal("gdsfs_info not served")
	}
	got := map[string]string{}
	for _, l := range info.Metric[0].Label {
		got[l.GetName()] = l.GetValue()
	}
	if got["cufile_mode"] != "unavailable: host backend" || got["device"] != "host" {
		t.Errorf("gdsfs_info labels %v", got)
	}
	reasons := fams["gdsfs_autoload_fallback_reasons"]
	if reasons == nil || len(reasons.Metric) != 2 {
		t.Fatalf("per-reason map not served as labelled series: %v", reasons)
	}
}

func TestHistograms(t *testing.T) {
	m := New(func() map[string]any { return nil })
	m.ObserveLoad("posix", 4e9, 2*time.Second, false) // 2 GB/s
	m.ObserveLoad("posix", 1e9, time.Second, true)
	m.ObserveRequest("acquire", 3*time.Millisecond, nil)
	m.ObserveRequest("acquire", time.Millisecond, fmt.Errorf("open: %w", syscall.EACCES))
	fams := scrape(t, m)
	count := func(name string, labels ...string) (uint64, float64) {
		f := fams[name]
		if f == nil {
			t.Fatalf("%s not served", name)
		}
	next:
		for _, mt := range f.Metric {
			have := map[string]string{}
			for _, l := range mt.Label {
				have[l.GetName()] = l.GetValue()
			}
			for i := 0; i+1 < len(labels); i += 2 {
				if have[labels[i]] != labels[i+1] {
					continue next
				}
			}
			return mt.Histogram.GetSampleCount(), mt.Histogram.GetSampleSum()
		}
		t.Fatalf("%s has no series %v", name, labels)
		return 0, 0
	}
	if n, sum := count("gdsfs_load_duration_seconds", "path", "posix", "result", "ok"); n != 1 || sum != 2 {
		t.Errorf("load time ok: %d samples, sum %v", n, sum)
	}
	if n, _ := count("gdsfs_load_duration_seconds", "path", "posix", "result", "failed"); n != 1 {
		t.Errorf("load time failed: %d samples", n)
	}
	if n, sum := count("gdsfs_load_gbps", "path", "posix"); n != 1 || sum != 2 {
		t.Errorf("load GB/s: %d samples, sum %v (a failed load must not count)", n, sum)
	}
	if n, _ := count("gdsfs_lease_request_duration_seconds", "op", "acquire", "result", "EACCES"); n != 1 {
		t.Errorf("lease latency EACCES: %d samples", n)
	}
	if n, _ := count("gdsfs_lease_request_duration_seconds", "op", "acquire", "result", "ok"); n != 1 {
		t.Errorf("lease latency ok: %d samples", n)
	}
}

func TestOptionsValidate(t *testing.T) {
	for in, bad := range map[string]bool{
		"": false, "127.0.0.1:9464": false, ":9464": false, "localhost:0": false, "[::1]:9464": false,
		"9464": true, "127.0.0.1:http": true, "example.com:80": true, "127.0.0.1:70000": true,
	} {
		err := (&Options{Listen: in}).Validate()
		if (err != nil) != bad {
			t.Errorf("Validate(%q) = %v, want failure %v", in, err, bad)
		}
		if err != nil && !strings.HasPrefix(err.Error(), "metrics.listen: ") {
			t.Errorf("Validate(%q) = %v: does not name the key", in, err)
		}
	}
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Untyped != nil:
		return m.Untyped.GetValue()
	}
	return -1
}
