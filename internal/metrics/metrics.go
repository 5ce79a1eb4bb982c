package metrics

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
)

// Metrics is one mount's registry and, once Serve was called, its HTTP
// endpoint.
type Metrics struct {
	reg        *prometheus.Registry
	loadTime   *prometheus.HistogramVec // seconds per load, by path and result
	loadRate   *prometheus.HistogramVec // GB/s per successful load, by path
	leaseTime  *prometheus.HistogramVec // seconds per lease request, by op and result
	srv        *http.Server
	ln         *limitListener
	limits     serveLimits
	serveDone  chan struct{}
	listenAddr string
}

// New makes the registry. stats returns the flat stats.json object; it is
// called on every scrape.
func New(stats func() map[string]any) *Metrics {
	m := &Metrics{
		limits: defaultLimits,
		reg:    prometheus.NewRegistry(),
		loadTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "gdsfs_load_duration_seconds",
			Help:    "Time to stage one file, from the start of its load to resident or failed.",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 10), // 1 ms .. 262 s
		}, []string{"path", "result"}),
		loadRate: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "gdsfs_load_gbps",
			Help:    "Rate of each successful load in GB/s (10^9 bytes per second), by load path.",
			Buckets: []float64{0.25, 0.5, 1, 2, 4, 8, 12, 16, 24, 32, 48, 64},
		}, []string{"path"}),
		leaseTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "gdsfs_lease_request_duration_seconds",
			Help:    "Time the lease server took to answer one request, by op and result (ok or the errno).",
			Buckets: prometheus.ExponentialBuckets(0.0001, 4, 10), // 0.1 ms .. 26 s
		}, []string{"op", "result"}),
	}
	m.reg.MustRegister(statsCollector{stats: stats}, m.loadTime, m.loadRate, m.leaseTime)
	return m
}

// ObserveLoad records one finished load: path is the load path (cufile,
// posix, host), n the bytes loaded, d how long it took, failed whether it
// ended failed.
func (m *Metrics) ObserveLoad(path string, n int64, d time.Duration, failed bool) {
	if path == "" {
		path = "unknown"
	}
	result := "ok"
	if failed {
		result = "failed"
	}
	m.loadTime.WithLabelValues(path, result).Observe(d.Seconds())
	if !failed && d > 0 && n > 0 {
		m.loadRate.WithLabelValues(path).Observe(float64(n) / d.Seconds() / 1e9)
	}
}

// ObserveRequest records one answered lease request; it has the signature
// of ipc.Config.Observe. result is "ok", or the error's errno name.
func (m *Metrics) ObserveRequest(op string, d time.Duration, err error) {
	m.leaseTime.WithLabelValues(op, resultOf(err)).Observe(d.Seconds())
}

// Handler serves the registry in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}

// Serve listens on addr (HOST:PORT) and serves /metrics until Close. A
// failure to listen is returned at once, naming metrics.listen. It holds at
// most a few connections at once, each for a bounded time (serveLimits).
func (m *Metrics) Serve(addr string, log *zap.Logger) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("metrics.listen: %w", err)
	}
	ln := newLimitListener(l, m.limits.conns)
	mux := http.NewServeMux()
	mux.Handle("/metrics", m.Handler())
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "gdsfs: metrics are at /metrics", http.StatusNotFound)
	})
	m.srv = &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: m.limits.readHeader,
		ReadTimeout:       m.limits.read,
		WriteTimeout:      m.limits.write,
		IdleTimeout:       m.limits.idle,
		ErrorLog:          zap.NewStdLog(log),
	}
	m.ln = ln
	m.listenAddr = ln.Addr().String()
	m.serveDone = make(chan struct{})
	go func() {
		defer close(m.serveDone)
		if err := m.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics endpoint stopped", zap.Error(err))
		}
	}()
	log.Info("serving metrics", zap.String("url", "http://"+m.listenAddr+"/metrics"))
	return nil
}

// Addr is the address Serve listens on ("" before Serve).
func (m *Metrics) Addr() string { return m.listenAddr }

// Close stops the endpoint, if serving.
func (m *Metrics) Close() {
	if m.srv == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	m.srv.Shutdown(ctx)
	<-m.serveDone
}

// resultOf names err for a label: "ok", an errno name ("EACCES"), or
// "error".
func resultOf(err error) string {
	if err == nil {
		return "ok"
	}
	var en interface{ Errno() string }
	if errors.As(err, &en) {
		return en.Errno()
	}
	if name := errnoName(err); name != "" {
		return name
	}
	return "error"
}

// sortedKeys returns m's keys in order.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// metricName makes a Prometheus name of a stats key.
func metricName(key string) string {
	var b strings.Builder
	b.WriteString("gdsfs_")
	for _, r := range key {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	return b.String()
}
