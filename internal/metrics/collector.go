package metrics

import (
	"errors"
	"strings"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"
)

// gauges are the stats keys that go up and down; counters only grow.
// A numeric key in neither list (added later by another part) is served
// untyped under its own name, so no counter is mislabelled.
var (
	gauges = map[string]bool{
		"staged_files": true, "loading_files": true, "failed_files": true,
		"resident_bytes": true, "used_bytes": true, "capacity_bytes": true,
		"leases_active": true, "passthrough": true,
		"prefetch_queued": true, "leases_pinned": true, "room_waiting": true,
		"readers_open": true, "io_threads": true, "io_bounce_bytes": true,
		"descriptors_used": true, "descriptor_budget": true, "descriptor_reserve": true,
		"ipc_open_connections": true, "lease_held_bytes": true, "lease_held_files": true,
		"lease_holding_connections": true, "open_files": true, "max_open_per_uid": true,
	}
	counters = map[string]bool{
		"opens": true, "reads_served": true, "bytes_served": true,
		"prefetches": true, "prefetch_dropped": true, "hits": true, "misses": true,
		"shared_loads": true, "evictions": true, "invalidations": true,
		"load_errors": true, "too_large": true, "no_space": true,
		"bytes_cufile": true, "bytes_posix": true, "bytes_host": true,
		"cufile_fallbacks": true, "leases_total": true, "lease_denied": true,
		"ipc_connections": true, "ipc_requests": true, "ipc_bad_requests": true,
		"autoload_fallbacks": true, "change_events": true, "racy_waits": true,
		"load_retries": true, "free_errors": true, "room_waits": true, "deferred_opens": true,
		"yielded_to_readers": true, "mapped_read_waits": true,
		"ipc_accept_errors": true, "ipc_timeouts": true, "ipc_refused": true,
		"opens_refused": true, "replaced_not_kept": true,
	}
)

// CounterName is the metric a stats key is served as: counters end in
// _total (leases_total stays gdsfs_leases_total), gauges and untyped keys
// keep their name.
func CounterName(key string) string {
	name := metricName(key)
	if counters[key] && !strings.HasSuffix(name, "_total") {
		name += "_total"
	}
	return name
}

// statsCollector turns the stats.json object into metrics at each scrape.
// It is unchecked (Describe sends nothing): the keys are whatever the
// parts of the daemon report.
type statsCollector struct {
	stats func() map[string]any
}

func (statsCollector) Describe(chan<- *prometheus.Desc) {}

func (c statsCollector) Collect(ch chan<- prometheus.Metric) {
	m := c.stats()
	labels := map[string]string{}
	for _, key := range sortedKeys(m) {
		switch v := m[key].(type) {
		case string:
			labels[key] = v
		case map[string]any:
			if key == "cufile" {
				collectCuFile(ch, v)
				continue
			}
			collectMap(ch, key, v)
		default:
			if f, ok := number(v); ok {
				ch <- prometheus.MustNewConstMetric(desc(key, nil), valueType(key), f)
			}
		}
	}
	names := sortedKeys(labels)
	values := make([]string, len(names))
	for i, k := range names {
		values[i] = labels[k]
	}
	info := prometheus.NewDesc("gdsfs_info", "The mount's non-numeric stats (device, cufile_mode, passthrough_reason, ...) as labels; the value is 1.", names, nil)
	ch <- prometheus.MustNewConstMetric(info, prometheus.GaugeValue, 1, values...)
}

// collectMap serves a nested object of numbers (counts per reason) as one
// metric with a "name" label.
func collectMap(ch chan<- prometheus.Metric, key string, m map[string]any) {
	d := desc(key, []string{"name"})
	for _, k := range sortedKeys(m) {
		if f, ok := number(m[k]); ok {
			ch <- prometheus.MustNewConstMetric(d, valueType(key), f, k)
		}
	}
}

// collectCuFile serves stats.json's cufile object: cuFile's own read
// counters (totals, then per GPU and path) and the attribution check's
// state (ok, pending, mismatch or unavailable) as a label.
func collectCuFile(ch chan<- prometheus.Metric, m map[string]any) {
	counter := func(name, help string, v any, labels []string, values ...string) {
		if f, ok := number(v); ok {
			d := prometheus.NewDesc("gdsfs_cufile_"+name, help, labels, nil)
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, f, values...)
		}
	}
	counter("read_bytes_total", "Bytes cuFile counted as read (its level 1 statistics), all GPUs.", m["read_bytes"], nil)
	counter("read_ops_total", "cuFileReads that succeeded, by cuFile's count, all GPUs.", m["read_ops"], nil)
	counter("read_errors_total", "cuFileReads that failed, by cuFile's count, all GPUs.", m["read_errors"], nil)
	gpus, _ := m["gpus"].([]any)
	for _, g := range gpus {
		gm, _ := g.(map[string]any)
		name, _ := gm["name"].(string)
		counter("gpu_read_bytes_total", "Bytes cuFile counted as read onto the GPU (level 3 statistics).",
			gm["read_bytes"], []string{"gpu"}, name)
		for _, path := range []string{"nvfs", "posix", "p2p"} {
			counter("gpu_reads_total", "Reads cuFile counted onto the GPU by path: nvfs (GPUDirect Storage), posix (compat mode), p2p (PCIe P2PDMA).",
				gm[path+"_reads"], []string{"gpu", "path"}, name, path)
		}
		counter("gpu_read_errors_total", "Reads onto the GPU that cuFile counted as failed.", gm["read_errors"], []string{"gpu"}, name)
	}
	if f, ok := number(m["level"]); ok {
		d := prometheus.NewDesc("gdsfs_cufile_statistics_level", "cuFile's statistics level in force (0: unavailable).", nil, nil)
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, f)
	}
	if a, ok := m["attribution"].(string); ok {
		state, _, _ := strings.Cut(a, " ")
		d := prometheus.NewDesc("gdsfs_cufile_attribution",
			"1 under the state of the check of gdsfs's cuFile bytes against cuFile's own counters (ok, pending:, mismatch, unavailable:).",
			[]string{"state"}, nil)
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, 1, strings.TrimSuffix(state, ":"))
	}
}

func desc(key string, labels []string) *prometheus.Desc {
	return prometheus.NewDesc(CounterName(key), "stats.json "+key+" (see docs/operations.md, Control files).", labels, nil)
}

func valueType(key string) prometheus.ValueType {
	switch {
	case counters[key]:
		return prometheus.CounterValue
	case gauges[key]:
		return prometheus.GaugeValue
	}
	return prometheus.UntypedValue
}

// number converts what encoding/json decodes (float64, bool) and plain Go
// numbers.
func number(v any) (float64, bool) {
	switch x := v.(type) {
	case float64:
		return x, true
	case bool:
		if x {
			return 1, true
		}
		return 0, true
	case int:
		return float64(x), true
	case int64:
		return float64(x), true
	case uint64:
		return float64(x), true
	}
	return 0, false
}

// errnoName is the errno's name ("EACCES") when err wraps one.
func errnoName(err error) string {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return unix.ErrnoName(errno)
	}
	return ""
}
