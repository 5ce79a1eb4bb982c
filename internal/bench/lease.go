package bench

import (
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/gdsfs/gdsfs/client"
	"github.com/gdsfs/gdsfs/internal/config"
	"github.com/gdsfs/gdsfs/internal/devices"
	"github.com/gdsfs/gdsfs/internal/units"
)

//go:embed lease.py
var leaseScript []byte

// LeaseOptions are the flags of `gdsfs bench lease`.
type LeaseOptions struct {
	Size   units.Size
	Runs   int
	Dir    string   // work directory (a disk filesystem)
	Python string   // directory holding the gdsfs Python package; "" is python/ beside the binary's directory
	Sets   []string // config.yaml keys for the mount
}

// LeaseDoc is the long help of `gdsfs bench lease`.
const LeaseDoc = `Mounts a file of --size (self-exec), stages it, then times consumers taking a
lease on the resident file: the Go client (acquire, map, pointer) and, where
python3 with torch and the gdsfs package answer, gdsfs.open() to a torch
tensor a kernel has read. The baseline is staging the same file again on
the POSIX path, measured in the same run. Needs root (it mounts).`

// Validate checks the options.
func (o LeaseOptions) Validate() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("bench lease mounts by syscall: run as root")
	}
	if o.Runs < 1 {
		return fmt.Errorf("--runs %d: want at least 1", o.Runs)
	}
	if _, err := config.Load("", o.Sets); err != nil {
		return err
	}
	return nil
}

// Lease runs `gdsfs bench lease` and prints its table to stdout.
func Lease(o LeaseOptions) error { return runLeaseBench(o) }

func runLeaseBench(o LeaseOptions) error {
	src, mnt := filepath.Join(o.Dir, "src"), filepath.Join(o.Dir, "mnt")
	for _, d := range []string{src, mnt} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	sb := StageOptions{Size: o.Size, Dir: src, Runs: 1}
	file, size, err := benchFile(sb)
	if err != nil {
		return err
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	argv := []string{exe, "mount", "--set", "ipc.socket=" + filepath.Join(o.Dir, "lease.sock")}
	for _, s := range o.Sets {
		argv = append(argv, "--set", s)
	}
	argv = append(argv, src, mnt)
	ctx := context.Background()
	d, err := startDaemon(ctx, "gdsfs", mnt, filepath.Join(o.Dir, "daemon.log"), argv, mountFS{gdsfs: true}.ready(mnt))
	if err != nil {
		return err
	}
	defer d.stop()
	path := filepath.Join(mnt, filepath.Base(file))
	if err := os.WriteFile(filepath.Join(mnt, ".gdsfs", "prefetch"), []byte(filepath.Base(file)+"\n"), 0); err != nil {
		return fmt.Errorf("prefetch: %w", err)
	}
	if err := waitResident(path, 5*time.Minute); err != nil {
		return err
	}
	device, goTimes, err := goLeaseTimes(path, o.Runs)
	if err != nil {
		return err
	}
	fmt.Printf("file %s (%s) staged on %s\n\n", path, units.HumanBytes(size), device)
	fmt.Printf("%-42s %10s %10s\n", "consumer", "min ms", "median ms")
	fmt.Printf("%-42s %10.3f %10.3f\n", "Go client: acquire + map -> device pointer", goTimes[0], goTimes[len(goTimes)/2])
	pyMedian := 0.0
	if py, err := pythonLeaseTimes(o, path); err != nil {
		fmt.Printf("%-42s unavailable: %v\n", "python: gdsfs.open -> torch tensor read", err)
	} else {
		pyMedian = py["median_ms"]
		fmt.Printf("%-42s %10.3f %10.3f\n", "python: gdsfs.open -> torch tensor read", py["min_ms"], py["median_ms"])
	}
	reread, err := rereadTime(file)
	if err != nil {
		fmt.Printf("%-42s unavailable: %v\n", "re-read on the POSIX path (baseline)", err)
	} else {
		fmt.Printf("%-42s %10.3f %10s  (%.2f GB/s)\n", "re-read on the POSIX path (baseline)", reread, "-", float64(size)/reread/1e6)
	}
	fmt.Println()
	latency := goTimes[len(goTimes)/2]
	who := "Go client"
	if pyMedian > 0 {
		latency, who = pyMedian, "torch tensor"
	}
	verdict := "PASS"
	if latency >= 2 {
		verdict = "MISS"
	}
	fmt.Printf("target  acquire -> usable %s < 2 ms: %s (median %.3f ms", who, verdict, latency)
	if reread > 0 {
		fmt.Printf("; %.0fx faster than re-reading", reread/latency)
	}
	fmt.Println(")")
	return nil
}

// goLeaseTimes times client.Open to a device pointer, in milliseconds,
// sorted.
func goLeaseTimes(path string, runs int) (string, []float64, error) {
	var times []float64
	device := ""
	for range runs + 1 {
		start := time.Now()
		l, err := client.Open(path)
		if err != nil {
			return "", nil, err
		}
		if l.Ptr() == 0 {
			return "", nil, fmt.Errorf("lease of %s has no pointer", path)
		}
		took := time.Since(start)
		device = l.Device()
		if err := l.Close(); err != nil {
			return "", nil, err
		}
		times = append(times, float64(took.Microseconds())/1000)
	}
	times = times[1:] // the first includes loading libcuda
	sort.Float64s(times)
	return device, times, nil
}

func pythonLeaseTimes(o LeaseOptions, path string) (map[string]float64, error) {
	pkg := o.Python
	if pkg == "" {
		exe, _ := os.Executable()
		pkg = filepath.Join(filepath.Dir(exe), "..", "python")
	}
	if _, err := os.Stat(filepath.Join(pkg, "gdsfs")); err != nil {
		return nil, fmt.Errorf("no gdsfs Python package in %s (--python)", pkg)
	}
	script := filepath.Join(o.Dir, "bench_lease.py")
	if err := os.WriteFile(script, leaseScript, 0o644); err != nil {
		return nil, err
	}
	cmd := exec.Command("python3", script, path, fmt.Sprint(o.Runs))
	cmd.Env = append(os.Environ(), "PYTHONPATH="+pkg)
	out, err := cmd.CombinedOutput()
	if err != nil {
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		return nil, fmt.Errorf("%v: %s", err, lines[len(lines)-1])
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	var r map[string]float64
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &r); err != nil {
		return nil, fmt.Errorf("bad output %q", out)
	}
	return r, nil
}

// rereadTime stages the file once more in-process on the POSIX path, page
// cache warm: what a consumer without leases pays. Milliseconds.
func rereadTime(file string) (float64, error) {
	cfg, err := config.Load("", []string{"staging.prefetch=manual", "io.compat_mode=on"})
	if err != nil {
		return 0, err
	}
	b := &stageBench{o: StageOptions{Runs: 2}, cfg: cfg, path: file}
	st, err := os.Stat(file)
	if err != nil {
		return 0, err
	}
	b.size = st.Size()
	devs, err := devices.Open(cfg.Staging, zap.NewNop())
	if err != nil {
		return 0, err
	}
	defer devices.Close(devs)
	b.dev = devs[0]
	row := b.stagePath("on")
	if row.Why != "" {
		return 0, fmt.Errorf("%s", row.Why)
	}
	return float64(b.size) / row.Warm / 1e6, nil
}
