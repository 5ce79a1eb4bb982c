// Package metrics serves a mount's counters to Prometheus: every key of
// .gdsfs/stats.json as a metric (counters, gauges, strings as labels of
// gdsfs_info), plus histograms of staging load time and load rate per load
// path and of lease request latency. It is off unless metrics.listen is
// set, and it only reads: nothing it serves changes the daemon. It holds
// at most a few connections, each for a bounded time (limit.go): a client
// of the endpoint must never take the descriptors the mount needs.
//
// The counters are read at scrape time from the same function that fills
// stats.json, so the two always agree. The histograms are fed by
// ObserveLoad (from staging events) and ObserveRequest (from the lease
// server), wired in cmd/gdsfs.
package metrics
