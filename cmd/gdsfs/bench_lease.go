package main

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

	"github.com/spf13/cobra"

	"github.com/gdsfs/gdsfs/client"
	"github.com/gdsfs/gdsfs/internal/config"
	"github.com/gdsfs/gdsfs/internal/units"
)

//go:embed bench_lease.py
var leaseScript []byte

type leaseBenchOptions struct {
	size   units.Size
	runs   int
	dir    string
	python string
	sets   []string
}

func benchLeaseCmd() *cobra.Command {
	o := leaseBenchOptions{size: 1 << 30}
	c := &cobra.Command{
		Use:   "lease [--size 1GiB] [--runs 20] [--set key=value]...",
		Short: "Time from acquire to a usable pointer or tensor, against re-reading the file",
		Long: `Mounts a file of --size (self-exec), stages it, then times consumers taking a
lease on the resident file: the Go client (acquire, map, pointer) and, where
python3 with torch and the gdsfs package answer, gdsfs.open() to a torch
tensor a kernel has read. The baseline is staging the same file again on
the POSIX path, measured in the same run. Needs root (it mounts).`,
		Args: exactArgs(),
		RunE: func(cmd *cobra.Command, args []string) error {
			if os.Geteuid() != 0 {
				return usageError{fmt.Errorf("bench lease mounts by syscall: run as root")}
			}
			if o.runs < 1 {
				return usageError{fmt.Errorf("--runs %d: want at least 1", o.runs)}
			}
			if _, err := config.Load("", o.sets); err != nil {
				return usageError{err}
			}
			return runLeaseBench(o)
		},
	}
	f := c.Flags()
	f.Var(sizeFlag{&o.size}, "size", "file size")
	f.IntVar(&o.runs, "runs", 20, "acquisitions timed; min and median are reported")
	f.StringVar(&o.dir, "dir", "/var/tmp/gdsfs-bench-lease", "work directory (a disk filesystem)")
	f.StringVar(&o.python, "python", "", "directory holding the gdsfs Python package (default: python/ beside the binary's directory)")
	f.StringArrayVar(&o.sets, "set", nil, "config.yaml key for the mount")
	return c
}

func runLeaseBench(o leaseBenchOptions) error {
	src, mnt := filepath.Join(o.dir, "src"), filepath.Join(o.dir, "mnt")
	for _, d := range []string{src, mnt} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	sb := stageBenchOptions{size: o.size, dir: src, runs: 1}
	file, size, err := benchFile(sb)
	if err != nil {
		return err
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	argv := []string{exe, "mount", "--set", "ipc.socket=" + filepath.Join(o.dir, "lease.sock")}
	for _, s := range o.sets {
		argv = append(argv, "--set", s)
	}
	argv = append(argv, src, mnt)
	ctx := context.Background()
	d, err := mbStartDaemon(ctx, "gdsfs", mnt, filepath.Join(o.dir, "daemon.log"), argv, mbFS{gdsfs: true}.ready(mnt))
	if err != nil {
		return err
	}
	defer d.stop()
	path := filepath.Join(mnt, filepath.Base(file))
	if err := os.WriteFile(filepath.Join(mnt, ".gdsfs", "prefetch"), []byte(filepath.Base(file)+"\n"), 0); err != nil {
		return fmt.Errorf("prefetch: %w", err)
	}
	if err := waitResident([]warmFile{{path: path, rel: filepath.Base(file), size: size}}, 5*time.Minute); err != nil {
		return err
	}
	device, goTimes, err := goLeaseTimes(path, o.runs)
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

func pythonLeaseTimes(o leaseBenchOptions, path string) (map[string]float64, error) {
	pkg := o.python
	if pkg == "" {
		exe, _ := os.Executable()
		pkg = filepath.Join(filepath.Dir(exe), "..", "python")
	}
	if _, err := os.Stat(filepath.Join(pkg, "gdsfs")); err != nil {
		return nil, fmt.Errorf("no gdsfs Python package in %s (--python)", pkg)
	}
	script := filepath.Join(o.dir, "bench_lease.py")
	if err := os.WriteFile(script, leaseScript, 0o644); err != nil {
		return nil, err
	}
	cmd := exec.Command("python3", script, path, fmt.Sprint(o.runs))
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
	b := &stageBench{o: stageBenchOptions{runs: 2}, cfg: cfg, path: file}
	st, err := os.Stat(file)
	if err != nil {
		return 0, err
	}
	b.size = st.Size()
	devs, err := openDevices(cfg.Staging, nopLogger())
	if err != nil {
		return 0, err
	}
	defer closeDevices(devs)
	b.dev = devs[0]
	row := b.stagePath("on")
	if row.Why != "" {
		return 0, fmt.Errorf("%s", row.Why)
	}
	return float64(b.size) / row.Warm / 1e6, nil
}
