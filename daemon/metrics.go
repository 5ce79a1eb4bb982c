package daemon

import (
	"time"

	"github.com/gdsfs/gdsfs/internal/metrics"
)

// startMetrics serves metrics.listen, when set, before anything is
// mounted, so a port in use fails the start with nothing to undo. Scrapes
// read the same counters as stats.json.
//
// The load histograms are fed by staging events (daemon.start subscribes);
// the lease latency histogram by ipc.Config.Observe.
func (d *daemon) startMetrics() error {
	if d.cfg.Metrics.Listen == "" {
		return nil
	}
	d.metrics = metrics.New(d.liveStats)
	return d.metrics.Serve(d.cfg.Metrics.Listen, d.log.Named("metrics"))
}

// liveStats is stats.json's object once mounted; empty before.
func (d *daemon) liveStats() map[string]any {
	srv := d.served.Load()
	if srv == nil {
		return map[string]any{}
	}
	return d.stats(srv)
}

// loadEvent is the part of a staging.Event (Rel, State,
// LoadPath, Bytes, Duration, Err) the histograms read.
type loadEvent struct {
	State    string // absent, loading, resident, failed
	LoadPath string // cufile, posix, host
	Bytes    int64
	Duration time.Duration // of the load that ended in State
	Err      error
}

// observeLoad counts the end of each load: resident or failed, with the
// load's duration. Other transitions (loading, eviction to absent) are not
// loads.
func observeLoad(m *metrics.Metrics, e loadEvent) {
	if m == nil || e.Duration <= 0 {
		return
	}
	switch e.State {
	case "resident":
		m.ObserveLoad(e.LoadPath, e.Bytes, e.Duration, false)
	case "failed":
		m.ObserveLoad(e.LoadPath, e.Bytes, e.Duration, true)
	}
}

// observeRequest is ipc.Config.Observe: one answered lease request.
func (d *daemon) observeRequest(op string, took time.Duration, err error) {
	if d.metrics != nil {
		d.metrics.ObserveRequest(op, took, err)
	}
}
