package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"syscall"

	"github.com/gdsfs/gdsfs/fs"
	"github.com/gdsfs/gdsfs/gpu/cuda"
	"github.com/gdsfs/gdsfs/internal/access"
	"github.com/gdsfs/gdsfs/staging"
	"github.com/gdsfs/gdsfs/staging/triggers/readahead"
)

// controls are the files of MOUNTPOINT/.gdsfs/; srv is the mount they
// report on.
func (d *daemon) controls(srv *fs.Server) []fs.Control {
	stats := func(access.Cred) map[string]any { return d.stats(srv) }
	return []fs.Control{
		{Name: "stats", Read: func(c access.Cred) []byte { return formatStats(stats(c)) }},
		{Name: "stats.json", Read: func(c access.Cred) []byte { return statsJSON(stats(c)) }},
		{Name: "config", Read: func(access.Cred) []byte { return d.cfg.YAML() }},
		{Name: "cache", Read: func(c access.Cred) []byte { return d.cacheText(c, srv.CanRead) }},
		{Name: "version", Read: func(access.Cred) []byte { return []byte(d.version) }},
		{Name: "socket", Read: func(access.Cred) []byte { return []byte(d.ipc.Path() + "\n") }},
		{Name: "prefetch", Write: d.prefetch, WriteArgs: d.prefetchOn},
		{Name: "evict", Write: func(_ access.Cred, rel string) error { return d.cache.Evict(rel) }, WriteArgs: d.evictOn},
		{Name: "trace", Read: func(c access.Cred) []byte { return d.traceText(c, srv.Mountpoint()) }},
		{Name: "replay", Write: func(_ access.Cred, rel string) error { d.cache.Replay([]string{rel}); return nil }},
	}
}

// traceText is the access trace in the trace format (readahead.Trace),
// for root only: it names what every user opened. Others, and a daemon
// recording none (staging.trace_entries: 0), get the header and why.
func (d *daemon) traceText(c access.Cred, mnt string) []byte {
	var b bytes.Buffer
	rec, src := d.cache.Trace(), d.cache.Source()
	if rec != nil && c.UID == 0 {
		rec.Trace(mnt, src).WriteTo(&b)
		return b.Bytes()
	}
	fmt.Fprintf(&b, "# gdsfs-trace %d\n# mount: %s\n# source: %s\n", readahead.TraceVersion, mnt, src)
	if rec == nil {
		b.WriteString("# no trace recorded: staging.trace_entries is 0\n")
	} else {
		b.WriteString("# readable by root only\n")
	}
	return b.Bytes()
}

// gpusArg parses a control line's arguments: "gpus=LIST" (ordinals of
// staging.gpus, device names, or all).
func gpusArg(args string) ([]string, error) {
	list, ok := strings.CutPrefix(args, "gpus=")
	if !ok {
		return nil, fmt.Errorf("%q: the only argument is gpus=LIST: %w", args, syscall.EINVAL)
	}
	devs, err := staging.ParseDevices(list)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", err, syscall.EINVAL)
	}
	return devs, nil
}

// prefetchOn is prefetch for a line "PATH<TAB>gpus=LIST": a replica on
// each device named (staging.Cache.StageOn).
func (d *daemon) prefetchOn(_ access.Cred, rel, args string) error {
	devs, err := gpusArg(args)
	if err != nil {
		return err
	}
	if err := d.cache.Eligible(rel); err != nil {
		return err
	}
	ok, err := d.cache.PrefetchOn(rel, devs)
	switch {
	case err != nil:
		return err
	case !ok:
		return fmt.Errorf("prefetch %s: queue full (staging.prefetch_queue): %w", rel, syscall.EAGAIN)
	}
	return nil
}

// evictOn is evict for a line "PATH<TAB>gpus=LIST": only the replicas on
// the devices named.
func (d *daemon) evictOn(_ access.Cred, rel, args string) error {
	devs, err := gpusArg(args)
	if err != nil {
		return err
	}
	return d.cache.EvictOn(rel, devs)
}

// prefetch checks that rel can be staged, then queues it; a full queue is
// EAGAIN. fs has checked that the writer may read rel.
func (d *daemon) prefetch(_ access.Cred, rel string) error {
	if err := d.cache.Eligible(rel); err != nil {
		return err
	}
	if !d.cache.Prefetch(rel) {
		return fmt.Errorf("prefetch %s: queue full (staging.prefetch_queue): %w", rel, syscall.EAGAIN)
	}
	return nil
}

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

// cacheText is one line per entry the reader c may open for reading
// (canRead decides, as c): path, size, state, load path, GB/s, leases,
// tab-separated under a header.
func (d *daemon) cacheText(c access.Cred, canRead func(access.Cred, string) bool) []byte {
	var b bytes.Buffer
	b.WriteString("# path\tsize\tstate\tload_path\tload_gbps\tleases\tdevice\tnote\n")
	for _, e := range d.cache.Entries() {
		if !canRead(c, e.Path) {
			continue
		}
		fmt.Fprintf(&b, "%s\t%d\t%s\t%s\t%.2f\t%d\t%s\t%s\n", e.Path, e.Size, e.State, orDash(e.LoadPath), e.GBps, e.Leases, e.Device, orDash(e.Note))
	}
	return b.Bytes()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// versionText adds the devices, the CUDA driver and cuFile to the
// binary's versions.
func (d *daemon) versionText() string {
	var b strings.Builder
	b.WriteString(versionText())
	for _, dev := range d.devs {
		fmt.Fprintf(&b, "device %s (%s)\n", dev.Name(), dev.Kind())
	}
	if d.devs[0].Kind() == "cuda" {
		r := cuda.Check()
		fmt.Fprintf(&b, "cuda-driver %s\n", r.DriverVersion)
		fmt.Fprintf(&b, "cufile %s\n", r.CuFile.Version)
	}
	fmt.Fprintf(&b, "cufile-mode %s\n", cufileMode(d.devs))
	return b.String()
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
