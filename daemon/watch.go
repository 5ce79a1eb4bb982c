package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/gdsfs/gdsfs/internal/mountinfo"
)

// Stats is MOUNT/.gdsfs/stats (asJSON: stats.json) of the gdsfs mount
// holding path, which may be the mount point or any path under it.
func Stats(path string, asJSON bool) ([]byte, error) {
	mnt, err := statsMount(path)
	if err != nil {
		return nil, err
	}
	name := "stats"
	if asJSON {
		name = "stats.json"
	}
	data, err := os.ReadFile(filepath.Join(mnt, ".gdsfs", name))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", mnt, err)
	}
	return data, nil
}

// statsMount is the root of the gdsfs mount holding path.
func statsMount(path string) (string, error) {
	mnt, _, err := mountinfo.Root(path)
	if err != nil {
		return "", fmt.Errorf("%s: not a gdsfs mount, nor a path under one", path)
	}
	return mnt, nil
}

// readStatsJSON reads MOUNT/.gdsfs/stats.json.
func readStatsJSON(mnt string) (map[string]any, error) {
	b, err := os.ReadFile(filepath.Join(mnt, ".gdsfs", "stats.json"))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", mnt, err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("%s/.gdsfs/stats.json: %w", mnt, err)
	}
	return m, nil
}

// WatchStats prints to w a line of rates every interval, from the
// stats.json of the gdsfs mount holding path: count lines (0: until ctx
// ends), a header every 20.
func WatchStats(ctx context.Context, w io.Writer, path string, interval time.Duration, count int) error {
	if interval <= 0 {
		return UsageError{fmt.Errorf("--interval %s: want a positive duration", interval)}
	}
	mnt, err := statsMount(path)
	if err != nil {
		return err
	}
	prev, err := readStatsJSON(mnt)
	if err != nil {
		return err
	}
	last := time.Now()
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for n := 0; count == 0 || n < count; n++ {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		cur, err := readStatsJSON(mnt)
		if err != nil {
			return err
		}
		now := time.Now()
		if n%20 == 0 {
			fmt.Fprintln(w, watchHeader)
		}
		fmt.Fprintln(w, rateLine(prev, cur, now.Sub(last), now))
		prev, last = cur, now
	}
	return nil
}

// watchColumns are the --watch columns: a rate of a counter, or a gauge.
var watchColumns = []struct {
	head string
	keys []string // summed
	rate bool
	unit float64 // divisor
}{
	{"opens/s", []string{"opens"}, true, 1},
	{"hits/s", []string{"hits"}, true, 1},
	{"misses/s", []string{"misses"}, true, 1},
	{"posix_MB/s", []string{"bytes_posix"}, true, 1e6},
	{"cufile_MB/s", []string{"bytes_cufile"}, true, 1e6},
	{"host_MB/s", []string{"bytes_host"}, true, 1e6},
	{"leases/s", []string{"leases_total"}, true, 1},
	{"evict/s", []string{"evictions"}, true, 1},
	{"errors/s", []string{"load_errors"}, true, 1},
	{"resident_MB", []string{"resident_bytes"}, false, 1e6},
	{"leases", []string{"leases_active"}, false, 1},
}

var watchHeader = func() string {
	heads := []string{fmt.Sprintf("%-8s", "time")}
	for _, c := range watchColumns {
		heads = append(heads, fmt.Sprintf("%11s", c.head))
	}
	return strings.Join(heads, " ")
}()

// rateLine is one --watch line: counters as rates over elapsed, gauges as
// they are in cur.
func rateLine(prev, cur map[string]any, elapsed time.Duration, now time.Time) string {
	cols := []string{now.Format("15:04:05")}
	sum := func(m map[string]any, keys []string) float64 {
		t := 0.0
		for _, k := range keys {
			if f, ok := m[k].(float64); ok {
				t += f
			}
		}
		return t
	}
	for _, c := range watchColumns {
		v := sum(cur, c.keys)
		if c.rate {
			v = (v - sum(prev, c.keys)) / elapsed.Seconds()
		}
		cols = append(cols, fmt.Sprintf("%11.1f", v/c.unit))
	}
	return strings.Join(cols, " ")
}
