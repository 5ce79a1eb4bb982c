package integration

import (
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/gdsfs/gdsfs/internal/metrics"
)

// TestMetricsAgreeWithStats: the metrics endpoint, scraped over HTTP and
// parsed with Prometheus's text parser, serves every numeric stats.json
// key with the same value.
func TestMetricsAgreeWithStats(t *testing.T) {
	src := sourceTree(t)
	m := startMount(t, src, "metrics.listen=127.0.0.1:0")
	url := regexp.MustCompile(`http://127\.0\.0\.1:[0-9]+/metrics`).FindString(m.log.String())
	if url == "" {
		t.Fatalf("the log does not name the metrics URL:\n%s", m.log)
	}
	// Activity for the counters, then quiet: every file resident, no lease.
	files := []string{m.path("data/fc.bin"), m.path("data/fd.bin"), m.path("data/fg.bin")}
	leaseSum(t, files[0])
	out, err := exec.Command(bins.gdsfs, append([]string{"warmup", "--wait"}, files...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("warmup: %v\n%s", err, out)
	}
	// Quiet: every other connection (the lease checker's, warmup's) has
	// ended; waitStat's own stays open, in both readings alike.
	waitStat(t, m, "ipc_open_connections", 0)
	waitStat(t, m, "leases_active", 0)
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("Prometheus text parser: %v", err)
	}
	var stats map[string]any
	if err := json.Unmarshal([]byte(m.control("stats.json")), &stats); err != nil {
		t.Fatal(err)
	}
	numeric := 0
	for key, v := range stats {
		var want float64
		switch x := v.(type) {
		case float64:
			want = x
		case bool:
			if x {
				want = 1
			}
		default:
			continue
		}
		numeric++
		f := fams[metrics.CounterName(key)]
		if f == nil {
			t.Errorf("stats.json %s has no metric %s", key, metrics.CounterName(key))
			continue
		}
		if got := metricValue(f.Metric[0]); got != want {
			t.Errorf("%s = %v, stats.json %s = %v", f.GetName(), got, key, want)
		}
	}
	if numeric < 20 || stats["leases_total"].(float64) != 1 || stats["staged_files"].(float64) < 3 {
		t.Fatalf("too little activity to compare: %v", stats)
	}
	info := fams["gdsfs_info"]
	if info == nil || !hasLabel(info.Metric[0], "cufile_mode", stats["cufile_mode"].(string)) {
		t.Errorf("gdsfs_info does not carry cufile_mode %q", stats["cufile_mode"])
	}
	for _, h := range []string{"gdsfs_load_duration_seconds", "gdsfs_load_gbps", "gdsfs_lease_request_duration_seconds"} {
		if _, ok := fams[h]; !ok {
			t.Logf("%s has no samples yet (fed by staging.Cache.Subscribe and ipc.Config.Observe once connected)", h)
		}
	}
}

func metricValue(m *dto.Metric) float64 {
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

func hasLabel(m *dto.Metric, name, value string) bool {
	for _, l := range m.Label {
		if l.GetName() == name && l.GetValue() == value {
			return true
		}
	}
	return false
}

// TestLeaseAcrossContainerBoundary: a consumer in its own PID and mount
// namespace (unshare, as a container runtime makes them) sees the mount
// at another path and the lease socket only through a bind mount, as a
// Kubernetes pod with hostPath volumes does. It gets the file's bytes, and
// as uid 65534 it is refused the file that uid may not read.
func TestLeaseAcrossContainerBoundary(t *testing.T) {
	need(t, "unshare", "setpriv", "mount", "bash")
	src := t.TempDir()
	os.Chmod(src, 0o755)
	randomFile(t, filepath.Join(src, "ok.bin"), 300000, 21)
	randomFile(t, filepath.Join(src, "secret.bin"), 70000, 22)
	os.Chmod(filepath.Join(src, "secret.bin"), 0o600)
	m := startMount(t, src, "fuse.allow_other=true")
	sock := strings.TrimSpace(m.control("socket"))
	sockDir := filepath.Dir(sock)
	ctr := t.TempDir() // the container's view: data/ (the mount), the socket's directory rebound
	for _, d := range []string{ctr, filepath.Dir(m.mnt), sockDir} {
		os.Chmod(d, 0o755)
	}
	os.MkdirAll(filepath.Join(ctr, "data"), 0o755)
	os.MkdirAll(filepath.Join(ctr, "sock"), 0o755)
	script := `set -e
mount --bind "$MNT" "$CTR/data"          # hostPath volume of the mount
mount --bind "$SOCKDIR" "$CTR/sock"      # hostPath volume of the socket directory...
mount -t tmpfs none "$SOCKDIR"           # ...which is all the container has of it
mkdir -p "$SOCKDIR" && mount --bind "$CTR/sock" "$SOCKDIR"
echo "pidns $(readlink /proc/self/ns/pid) pid $$"
"$LEASECHECK" "$CTR/data/ok.bin" "$CTR/data/secret.bin"
setpriv --reuid=65534 --regid=65534 --clear-groups "$LEASECHECK" "$CTR/data/ok.bin"
if setpriv --reuid=65534 --regid=65534 --clear-groups "$LEASECHECK" "$CTR/data/secret.bin" 2>"$CTR/denied"; then
	echo "uid 65534 leased secret.bin"; exit 1
fi
cat "$CTR/denied"
`
	cmd := exec.Command("unshare", "--pid", "--mount", "--fork", "--mount-proc", "bash", "-c", script)
	cmd.Env = append(os.Environ(), "MNT="+m.mnt, "CTR="+ctr, "SOCKDIR="+sockDir, "LEASECHECK="+bins.leasecheck)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("consumer in its own namespaces: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	ours, _ := os.Readlink("/proc/self/ns/pid")
	if !strings.HasPrefix(lines[0], "pidns ") || strings.Contains(lines[0], ours) || !strings.HasSuffix(lines[0], " pid 1") {
		t.Fatalf("the consumer did not run in its own PID namespace (ours %s): %q", ours, lines[0])
	}
	sums := map[string]int{}
	for _, l := range lines[1:4] {
		var r map[string]any
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatalf("leasecheck line %q: %v\n%s", l, err, out)
		}
		name := filepath.Base(r["path"].(string))
		if r["sha256"] != sha(t, filepath.Join(src, name)) {
			t.Errorf("%s: leased bytes differ from the file", name)
		}
		sums[name]++
	}
	if sums["ok.bin"] != 2 || sums["secret.bin"] != 1 {
		t.Fatalf("leases: %v\n%s", sums, out)
	}
	if !strings.HasPrefix(lines[4], "EACCES") {
		t.Fatalf("uid 65534 asking for a 0600 root file: %q, want EACCES", lines[4])
	}
	if s := statsOf(t, m); s["lease_denied"].(float64) != 1 {
		t.Fatalf("lease_denied = %v, want 1", s["lease_denied"])
	}
}
