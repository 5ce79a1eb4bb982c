package bench

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/internal/units"
	"github.com/gdsfs/gdsfs/proto"
)

//go:embed contention.py
var contentionScript []byte

// ContentionOptions are the flags of `gdsfs bench contention`.
type ContentionOptions struct {
	Consumers int
	Files     int
	FileSize  units.Size
	Capacity  units.Size
	Dir       string
	Py        PyFlags
	Sets      []string
	JSON      bool
	Report    string
}

//go:embed contention.md
var contentionHelp string

// ContentionDoc is the long help of `gdsfs bench contention`: contention.md and the exit-status rule.
var ContentionDoc = contentionHelp + "\n" + VerdictRule

// Validate checks the options.
func (o ContentionOptions) Validate() error {
	switch {
	case os.Geteuid() != 0:
		return fmt.Errorf("bench contention mounts by syscall: run as root")
	case o.Consumers < 1 || o.Files < 1:
		return fmt.Errorf("--consumers %d, --files %d: want at least 1", o.Consumers, o.Files)
	case o.FileSize < 1 || o.Capacity < o.FileSize:
		return fmt.Errorf("--capacity %s must hold at least one file of --file-size %s", o.Capacity, o.FileSize)
	}
	return nil
}

// consumerResult is what one consumer prints.
type consumerResult struct {
	Acquired   int            `json:"acquired"`
	Failed     int            `json:"failed"`
	Mismatches int            `json:"mismatches"`
	Errors     map[string]int `json:"errors"`
	FirstError string         `json:"first_error"`
	AcquireS   []float64      `json:"acquire_s"`
	Seconds    float64        `json:"seconds"`
}

// contentionResult is the JSON of `gdsfs bench contention`.
type contentionResult struct {
	Device        string         `json:"device"`
	Consumers     int            `json:"consumers"`
	Acquired      int            `json:"acquired"`
	Failed        int            `json:"failed"`
	Errors        map[string]int `json:"errors"`
	Mismatches    int            `json:"mismatches"`
	FirstError    string         `json:"first_error,omitempty"`
	ConsumerError string         `json:"consumer_error,omitempty"`
	AcquireMaxS   float64        `json:"acquire_max_s"`
	AcquireMedS   float64        `json:"acquire_median_s"`
	WallS         float64        `json:"wall_s"`
	LeasesActive  int64          `json:"leases_active_after"`
	Before        procUsage      `json:"daemon_before"`
	After         procUsage      `json:"daemon_after"`
	Checks        []Check        `json:"targets"`
}

type contention struct {
	o    ContentionOptions
	m    *benchMount
	py   *pyEnv
	rels []string
	job  string // the consumers' job file
}

// Contention runs `gdsfs bench contention` and prints its report.
func Contention(ctx context.Context, o ContentionOptions) error {
	if err := openWorkDir("--dir", o.Dir); err != nil {
		return err
	}
	c := &contention{o: o}
	src := filepath.Join(o.Dir, "files")
	var files []map[string]any
	for i := range o.Files {
		rel := filepath.Join("contention", fmt.Sprintf("c-%d-%04d.bin", int64(o.FileSize), i))
		sum, err := makeFile(filepath.Join(src, rel), int64(o.FileSize), true)
		if err != nil {
			return err
		}
		c.rels = append(c.rels, rel)
		files = append(files, map[string]any{"rel": rel, "size": int64(o.FileSize), "sha256": sum})
	}
	var err error
	if c.py, err = newPyEnv(o.Py, filepath.Join(o.Dir, "py"), false); err != nil {
		return err
	}
	sets := append(append([]string{}, o.Sets...), "staging.capacity="+strconv.FormatInt(int64(o.Capacity), 10))
	if c.m, err = startMount(ctx, o.Dir, "contention", src, sets); err != nil {
		return err
	}
	defer c.m.stop()
	res := &contentionResult{Consumers: o.Consumers, Errors: map[string]int{}}
	if res.Device, err = c.m.device(); err != nil {
		return err
	}
	if err := c.writeJob(files); err != nil {
		return err
	}
	if err := c.measure(ctx, res); err != nil {
		return err
	}
	res.Checks = contentionChecks(res)
	if err := printResult(os.Stdout, o.Report, "contention", res, o.JSON, func(w io.Writer) { writeContentionText(w, res) }); err != nil {
		return err
	}
	return verdict(res.Checks)
}

func (c *contention) writeJob(files []map[string]any) error {
	b, _ := json.Marshal(map[string]any{"mnt": c.m.mnt, "files": files})
	c.job = filepath.Join(c.py.dir, "contention-job.json")
	return writeNew(c.job, b, 0o644)
}

// measure: a warm-up round (every consumer leasing one file, all at
// once: what the daemon makes on first use at that concurrency, such as
// its loader threads' device handles, is made before "before"), usage
// before, the consumers, usage after.
func (c *contention) measure(ctx context.Context, res *contentionResult) error {
	script, err := c.py.write("bench_contention.py", contentionScript)
	if err != nil {
		return err
	}
	warm, errs := c.consumers(ctx, script, "1")
	if errs != nil {
		return fmt.Errorf("warm-up round: %w", errs)
	}
	for _, w := range warm {
		if w.Acquired != 1 || w.Mismatches != 0 {
			return fmt.Errorf("warm-up round: %s", w.FirstError)
		}
	}
	if res.Before, _, err = c.settle(ctx); err != nil {
		return err
	}
	start := time.Now()
	results, errs := c.consumers(ctx, script)
	res.WallS = time.Since(start).Seconds()
	if errs != nil {
		res.ConsumerError = errs.Error()
	}
	var acq []float64
	for _, r := range results {
		res.Acquired += r.Acquired
		res.Failed += r.Failed
		res.Mismatches += r.Mismatches
		for k, v := range r.Errors {
			res.Errors[k] += v
		}
		if res.FirstError == "" {
			res.FirstError = r.FirstError
		}
		acq = append(acq, r.AcquireS...)
	}
	res.AcquireMedS, res.AcquireMaxS = median(acq), bestOf(acq)
	res.After, res.LeasesActive, err = c.settle(ctx)
	return err
}

// consumers runs them all at once and collects what each printed; count
// ("" or one value) bounds the files each leases.
func (c *contention) consumers(ctx context.Context, script string, count ...string) ([]consumerResult, error) {
	results := make([]consumerResult, c.o.Consumers)
	errs := make([]error, c.o.Consumers)
	var wg sync.WaitGroup
	for i := range c.o.Consumers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = c.py.runJSON(ctx, 8*time.Minute, &results[i], script, append([]string{c.job, strconv.Itoa(i + 1)}, count...)...)
		}()
	}
	wg.Wait()
	return results, errors.Join(errs...)
}

// settle waits until no lease is active (bounded), evicts every file and
// returns the daemon's usage and the leases_active it saw last.
func (c *contention) settle(ctx context.Context) (procUsage, int64, error) {
	w, err := c.m.waiter()
	if err != nil {
		return procUsage{}, 0, err
	}
	defer w.close()
	var active int64
	err = w.zero(ctx, proto.StatLeasesActive, time.Minute)
	if timedOut(err) {
		var st map[string]any
		st, err = c.m.stats()
		active = statInt(st, "leases_active")
	}
	switch {
	case err != nil:
		return procUsage{}, active, err
	case active != 0: // leased files cannot be evicted: the check reports it
		u, err := c.usage()
		return u, active, err
	}
	if err := c.evictAll(ctx, w, time.Now().Add(30*time.Second)); err != nil {
		return procUsage{}, active, fmt.Errorf("empty the cache: %w", err)
	}
	u, err := c.usage()
	return u, active, err
}

// usage is the daemon's, less the descriptor of settle's own connection
// (answered, so accepted; open until settle returns).
func (c *contention) usage() (procUsage, error) {
	u, err := usageOf(c.m.d.cmd.Process.Pid)
	if err == nil {
		u.FDs--
		if u.FDKinds["socket"]--; u.FDKinds["socket"] == 0 {
			delete(u.FDKinds, "socket")
		}
	}
	return u, err
}

// evictAll evicts every file and waits until each reads absent (or
// failed). The consumers' connections held the files until they closed;
// lease_held_files reaching 0 says the daemon has seen them close. A file
// still loading is evicted again once loaded.
func (c *contention) evictAll(ctx context.Context, w *waiter, deadline time.Time) error {
	err := w.zero(ctx, proto.StatHeldFiles, time.Until(deadline))
	if timedOut(err) {
		return errors.New("the consumers' connections still hold files")
	} else if err != nil {
		return err
	}
	ev, err := c.m.controlFile("evict")
	if err != nil {
		return err
	}
	defer ev.Close()
	for _, r := range c.rels {
		if err := evictOne(ctx, w, ev, r, deadline); err != nil {
			return err
		}
	}
	return nil
}

// evictOne writes rel to .gdsfs/evict (ev) until it reads absent or
// failed: a file loading (EBUSY) is evicted again once resident.
func evictOne(ctx context.Context, w *waiter, ev *os.File, rel string, deadline time.Time) error {
	until := []string{proto.StateAbsent, proto.StateResident, proto.StateFailed}
	for tries := 1; ; tries++ {
		_, err := ev.WriteString(rel + "\n")
		if err != nil && !errors.Is(err, unix.EBUSY) && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("evict: %w", err)
		}
		state, err := w.state(ctx, rel, until, deadline)
		switch {
		case timedOut(err):
			return fmt.Errorf("%s: not evicted by the deadline", rel)
		case err != nil:
			return err
		case state == proto.StateAbsent || isFailed(state):
			return nil
		case tries == 3:
			return fmt.Errorf("%s: still %s after evicting it %d times", rel, state, tries)
		}
	}
}

// contentionChecks: every acquire, every byte, leases and resources back.
func contentionChecks(r *contentionResult) []Check {
	total := r.Acquired + r.Failed
	acq := boolCheck(fmt.Sprintf("every acquire succeeds (%d of %d)", r.Acquired, total), r.Failed == 0 && total > 0, r.ConsumerError)
	rssWant := float64(r.Before.RSSBytes)*1.1 + 16<<20
	return []Check{
		acq,
		boolCheck("no wrong bytes (every lease's sha256)", r.Mismatches == 0 && r.Acquired > 0, ""),
		boolCheck("leases_active back to 0", r.LeasesActive == 0, ""),
		newCheck("daemon descriptors back to where they were", float64(r.After.FDs), float64(r.Before.FDs), "fds", true, "not measured"),
		newCheck("daemon RSS within 10% + 16 MiB of before", float64(r.After.RSSBytes)/(1<<20), rssWant/(1<<20), "MiB", true, "not measured"),
	}
}

func writeContentionText(w io.Writer, r *contentionResult) {
	fmt.Fprintf(w, "%d consumers on %s: %d acquires succeeded, %d failed", r.Consumers, r.Device, r.Acquired, r.Failed)
	if len(r.Errors) > 0 {
		var parts []string
		for k, v := range r.Errors {
			parts = append(parts, fmt.Sprintf("%s %d", k, v))
		}
		sort.Strings(parts)
		fmt.Fprintf(w, " (%s)", strings.Join(parts, ", "))
	}
	fmt.Fprintf(w, "; %d wrong; %.1f s wall; acquire median %.3f s, max %.3f s\n", r.Mismatches, r.WallS, r.AcquireMedS, r.AcquireMaxS)
	if r.FirstError != "" {
		fmt.Fprintf(w, "first error: %s\n", r.FirstError)
	}
	if r.ConsumerError != "" {
		fmt.Fprintf(w, "consumer failures: %s\n", r.ConsumerError)
	}
	fmt.Fprintf(w, "leases_active after: %d\n", r.LeasesActive)
	fmt.Fprintf(w, "daemon before (after a warm-up round: every consumer leasing one file at once): RSS %s, %d fds; after: RSS %s, %d fds\n",
		units.HumanBytes(r.Before.RSSBytes), r.Before.FDs, units.HumanBytes(r.After.RSSBytes), r.After.FDs)
	if grown := fdKindsGrown(r.Before.FDKinds, r.After.FDKinds); grown != "" {
		fmt.Fprintf(w, "daemon descriptors grown: %s\n", grown)
	}
	fmt.Fprintln(w)
	writeChecks(w, r.Checks)
}
