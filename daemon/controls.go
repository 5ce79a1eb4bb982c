package daemon

import (
	"bytes"
	"fmt"
	"strings"
	"syscall"

	"github.com/gdsfs/gdsfs/fs"
	"github.com/gdsfs/gdsfs/internal/access"
	"github.com/gdsfs/gdsfs/internal/readahead"
	"github.com/gdsfs/gdsfs/staging"
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
		{Name: "cache.json", Read: func(c access.Cred) []byte { return d.cacheJSON(c, srv.CanRead) }},
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
