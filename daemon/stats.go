package daemon

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"sync"

	"github.com/gdsfs/gdsfs/fs"
	"github.com/gdsfs/gdsfs/internal/devices"
	"github.com/gdsfs/gdsfs/staging"
)

// sections orders the human stats; keys not listed go under [other].
var sections = []struct {
	name string
	keys []string
}{
	{"fuse", []string{"opens", "reads_served", "bytes_served", "passthrough", "passthrough_reason",
		"open_files", "max_open_per_uid", "opens_refused", "replaced_not_kept"}},
	{"staging", []string{"device", "staged_files", "loading_files", "failed_files", "resident_bytes", "used_bytes",
		"capacity_bytes", "prefetches", "prefetch_dropped", "hits", "misses", "shared_loads", "split_loads", "evictions",
		"invalidations", "load_errors", "too_large", "no_space", "free_errors", "change_detection", "change_events",
		"racy_waits", "load_retries", "room_waits", "room_waiting", "deferred_opens", "readers_open", "yielded_to_readers", "mapped_read_waits",
		"descriptors_used", "descriptor_budget", "descriptor_reserve"}},
	{"io", []string{"bytes_cufile", "bytes_posix", "bytes_host", "bytes_peer", "cufile_mode", "cufile_fallbacks", "cufile_last_error",
		"io_threads", "io_bounce_bytes"}},
	{"readahead", []string{"readahead_issued", "readahead_hits", "readahead_wasted_bytes", "readahead_cancelled",
		"readahead_declined", "readahead_dropped", "replay_pending", "replay_skipped"}},
	{"leases", []string{"leases_active", "leases_total", "leases_pinned", "lease_denied", "lease_held_bytes",
		"lease_held_files", "lease_holding_connections", "ipc_connections", "ipc_open_connections", "ipc_requests",
		"ipc_bad_requests", "ipc_accept_errors", "ipc_timeouts", "ipc_refused", "autoload_fallbacks",
		"autoload_fallback_reasons"}},
}

// stats merges the counters of every part into one flat object.
func (d *daemon) stats(srv *fs.Server) map[string]any {
	m := map[string]any{}
	merge := func(v any) {
		b, _ := json.Marshal(v)
		json.Unmarshal(b, &m)
	}
	cs := d.cache.Stats()
	merge(cs)
	merge(d.ipc.Stats())
	f := srv.Stats()
	m["opens"] = f.Opens
	m["reads_served"] = f.ReadsServed
	m["bytes_served"] = f.BytesServed
	m["passthrough"] = f.Passthrough
	m["passthrough_reason"] = f.PassthroughWhy
	m["open_files"] = f.OpenFiles
	m["max_open_per_uid"] = f.OpenPerUID
	m["opens_refused"] = f.OpensRefused
	m["replaced_not_kept"] = f.NotKept
	m["cufile_mode"] = cufileMode(d.devs)
	m["cufile"] = d.cufileStats(cs.Devices)
	m["device"] = strings.Join(d.cache.Devices(), ",")
	return m
}

func statsJSON(m map[string]any) []byte {
	b, _ := json.MarshalIndent(m, "", "  ")
	return append(b, '\n')
}

func formatStats(m map[string]any) []byte {
	var b bytes.Buffer
	seen := map[string]bool{}
	line := func(k string) {
		v := m[k]
		if f, ok := v.(float64); ok && f == float64(int64(f)) {
			v = int64(f)
		}
		if s, ok := v.(string); ok && s == "" {
			v = "-"
		}
		if mv, ok := v.(map[string]any); ok {
			v = formatMap(mv)
		}
		fmt.Fprintf(&b, "%s %v\n", k, v)
		seen[k] = true
	}
	for i, s := range sections {
		if i > 0 {
			b.WriteByte('\n')
		}
		fmt.Fprintf(&b, "[%s]\n", s.name)
		for _, k := range s.keys {
			if _, ok := m[k]; ok {
				line(k)
			}
		}
	}
	if writeDevices(&b, m["devices"]) {
		seen["devices"] = true
	}
	if writeCuFile(&b, m["cufile"]) {
		seen["cufile"] = true
	}
	var rest []string
	for k := range m {
		if !seen[k] {
			rest = append(rest, k)
		}
	}
	if len(rest) > 0 {
		sort.Strings(rest)
		b.WriteString("\n[other]\n")
		for _, k := range rest {
			line(k)
		}
	}
	return b.Bytes()
}

// writeDevices prints stats.json's devices as a [devices] section: one
// line per device, its name then its counters. false: none.
func writeDevices(b *bytes.Buffer, v any) bool {
	devs, ok := v.([]any)
	if !ok {
		return false
	}
	b.WriteString("\n[devices]\n")
	for _, d := range devs {
		if dm, ok := d.(map[string]any); ok {
			name := dm["name"]
			delete(dm, "name")
			for k, x := range dm {
				if f, ok := x.(float64); ok && f == float64(int64(f)) {
					dm[k] = int64(f)
				}
			}
			fmt.Fprintf(b, "%v %s\n", name, formatMap(dm))
		}
	}
	return true
}

// cufileAttribution is the daemon's check of its cuFile attribution
// against cuFile's own counters (it logs the first mismatch).
var cufileAttribution struct {
	once sync.Once
	a    *devices.Attribution
}

// cufileStats is stats.json's cufile object, decoded as JSON would be.
func (d *daemon) cufileStats(staged []staging.DeviceStats) map[string]any {
	cufileAttribution.once.Do(func() { cufileAttribution.a = devices.NewAttribution(d.log) })
	b, _ := json.Marshal(cufileAttribution.a.Section(d.devs, staged))
	var m map[string]any
	json.Unmarshal(b, &m)
	return m
}

// writeCuFile writes the [cufile] section of the human stats: the
// statistics level, the attribution check, cuFile's totals, then one line
// per GPU.
func writeCuFile(b *bytes.Buffer, v any) bool {
	m, ok := v.(map[string]any)
	if !ok {
		return false
	}
	b.WriteString("\n[cufile]\n")
	for _, k := range []string{"statistics", "attribution", "read_bytes", "read_ops", "read_errors"} {
		x := m[k]
		if f, ok := x.(float64); ok {
			x = uint64(f)
		}
		fmt.Fprintf(b, "%s %v\n", k, x)
	}
	gpus, _ := m["gpus"].([]any)
	for _, g := range gpus {
		if gm, ok := g.(map[string]any); ok {
			name := gm["name"]
			delete(gm, "name")
			for k, x := range gm {
				if f, ok := x.(float64); ok {
					gm[k] = uint64(f)
				}
			}
			fmt.Fprintf(b, "%v %s\n", name, formatMap(gm))
		}
	}
	return true
}

// formatMap prints a map of counts as "a=1,b=2" in key order ("-" when
// empty).
func formatMap(m map[string]any) string {
	if len(m) == 0 {
		return "-"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%v", k, m[k])
	}
	return strings.Join(parts, ",")
}
