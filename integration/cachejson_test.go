package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// cacheEntry is one entry of .gdsfs/cache.json.
type cacheEntry struct {
	Path     string  `json:"path"`
	Size     int64   `json:"size"`
	State    string  `json:"state"`
	LoadPath string  `json:"load_path"`
	GBps     float64 `json:"load_gbps"`
	Leases   int     `json:"leases"`
	Device   string  `json:"device"`
}

func cacheJSON(t *testing.T, data string) []cacheEntry {
	t.Helper()
	var l struct {
		Entries []cacheEntry `json:"entries"`
	}
	if err := json.Unmarshal([]byte(data), &l); err != nil {
		t.Fatalf(".gdsfs/cache.json: %v\n%s", err, data)
	}
	return l.Entries
}

// TestCacheJSON: .gdsfs/cache.json lists the entries of .gdsfs/cache as
// objects, one per replica, filtered per reader as the text is; warmup
// --gpus checks its replicas from it.
func TestCacheJSON(t *testing.T) {
	needMount(t)
	src := userDir(t)
	randomFile(t, filepath.Join(src, "pub/a b.bin"), 5000, 1)
	randomFile(t, filepath.Join(src, "private/hidden.bin"), 6000, 2)
	os.Chmod(filepath.Join(src, "pub"), 0o755)
	os.Chmod(filepath.Join(src, "private"), 0o700)
	m := startMount(t, src, "fuse.allow_other=true", "staging.prefetch=manual",
		"staging.device=host", "staging.host_devices=2", "staging.capacity=64MiB")
	os.Chmod(filepath.Dir(m.mnt), 0o755)
	if got := cacheJSON(t, m.control("cache.json")); len(got) != 0 {
		t.Fatalf("nothing staged yet, cache.json lists %+v", got)
	}
	sh(t, fmt.Sprintf("%s warmup --wait --gpus all %q", bins.gdsfs, m.path("pub/a b.bin")))
	sh(t, fmt.Sprintf("%s warmup --wait %s", bins.gdsfs, m.path("private/hidden.bin")))

	entries := cacheJSON(t, m.control("cache.json"))
	devices := map[string][]string{}
	for _, e := range entries {
		if e.State != "resident" || e.LoadPath == "" {
			t.Errorf("entry %+v: want resident with a load path", e)
		}
		if !strings.Contains(m.control("cache"), e.Path+"\t") {
			t.Errorf("entry %s is not in .gdsfs/cache", e.Path)
		}
		devices[e.Path] = append(devices[e.Path], e.Device)
	}
	if d := devices["pub/a b.bin"]; len(d) != 2 || d[0] == d[1] {
		t.Errorf("pub/a b.bin on %v, want a replica on each of two devices", d)
	}
	if d := devices["private/hidden.bin"]; len(d) != 1 {
		t.Errorf("private/hidden.bin on %v, want one replica", d)
	}
	for _, e := range entries {
		if e.Path == "pub/a b.bin" && e.Size != 5000 {
			t.Errorf("pub/a b.bin size %d, want 5000", e.Size)
		}
	}

	out := fsuser(t, user(), "read", m.path(".gdsfs/cache.json"))
	quoted, ok := strings.CutPrefix(out, "OK ")
	if !ok {
		t.Fatalf("uid %d cannot read .gdsfs/cache.json: %s", nobody, out)
	}
	data, err := strconv.Unquote(quoted)
	if err != nil {
		t.Fatalf("fsuser read: %v (%s)", err, out)
	}
	got := cacheJSON(t, data)
	for _, e := range got {
		if e.Path != "pub/a b.bin" {
			t.Errorf("uid %d's cache.json lists %s; want pub/a b.bin only", nobody, e.Path)
		}
	}
	if len(got) != 2 {
		t.Errorf("uid %d's cache.json: %+v, want the two replicas of pub/a b.bin", nobody, got)
	}
}

// TestWarmupGPUsNameNotUTF8: warmup --gpus checks the replicas of a file
// whose name is not UTF-8 (any byte but / and NUL names a file) as it
// checks any other: cache.json names it so that warmup finds it.
func TestWarmupGPUsNameNotUTF8(t *testing.T) {
	needMount(t)
	src := t.TempDir()
	randomFile(t, filepath.Join(src, "data", "shard-\xff.bin"), 5000, 1)
	randomFile(t, filepath.Join(src, "data", "shard-a.bin"), 5000, 2)
	m := startMount(t, src, "staging.prefetch=manual", "staging.device=host", "staging.host_devices=2", "staging.capacity=64MiB")
	sh(t, fmt.Sprintf("%s warmup --wait --gpus all %q", bins.gdsfs, m.path("data")))
}
