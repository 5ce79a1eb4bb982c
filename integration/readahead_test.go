package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// shardTree writes n shards of size bytes in SOURCE/shards and returns
// SOURCE and the shards' paths relative to it, in name order.
func shardTree(t *testing.T, n, size int) (string, []string) {
	src := t.TempDir()
	var rels []string
	for i := range n {
		rel := fmt.Sprintf("shards/shard-%04d.bin", i)
		randomFile(t, filepath.Join(src, rel), size, i+1)
		rels = append(rels, rel)
	}
	return src, rels
}

// TestReadAheadThroughMount: a reader that cats 40 files of
// 1 MiB in name order through the mount (defaults: read-ahead on,
// staging while read deferred) finds every file after the first four
// resident before it opens it: each is waited for as state "resident"
// before its open (the wait fails after 20s), so no timing decides it.
func TestReadAheadThroughMount(t *testing.T) {
	need(t, "getfattr")
	src, rels := shardTree(t, 40, 1<<20)
	m := startMount(t, src)
	for i, rel := range rels {
		if i >= 4 {
			waitState(t, m.path(rel), "resident")
		}
		sh(t, "cat "+m.path(rel)+" > /dev/null")
	}
	s := statsOf(t, m)
	// File i is planned at the open of file i-4, so when the reader
	// waited for file 39 the opens up to 35 had been seen: 4..35 are hits.
	if s["readahead_hits"].(float64) < 32 || s["readahead_wasted_bytes"].(float64) != 0 {
		t.Fatalf("readahead_hits %v wasted %v, want at least 32 and none", s["readahead_hits"], s["readahead_wasted_bytes"])
	}
	last := rels[len(rels)-1]
	if r := leaseSum(t, m.path(last)); r["sha256"] != sha(t, filepath.Join(src, last)) {
		t.Fatalf("%s: staged bytes differ from the file: %v", last, r)
	}
	if human := m.control("stats"); !strings.Contains(human, "[readahead]\nreadahead_issued ") {
		t.Fatalf("stats has no [readahead] section:\n%s", human)
	}
}

// stagedLine is the daemon's "staged" log line (log.level debug: one per
// load), with its path and seq.
var stagedLine = regexp.MustCompile(`\bstaged\b[^\n]*"path": "([^"]+)"[^\n]*"seq": (\d+)`)

// stagedOrder is the order of the daemon's loads, by the seq of its
// "staged" log lines: loads that end together may write their lines out
// of order (a replay's next load starts once the runner hears of the last
// one, before that one's line is written).
func stagedOrder(log string) []string {
	type staged struct {
		rel string
		seq int
	}
	var all []staged
	for _, m := range stagedLine.FindAllStringSubmatch(log, -1) {
		n, _ := strconv.Atoi(m[2])
		all = append(all, staged{m[1], n})
	}
	slices.SortFunc(all, func(a, b staged) int { return a.seq - b.seq })
	out := make([]string, len(all))
	for i, s := range all {
		out[i] = s.rel
	}
	return out
}

// TestTraceRecordAndReplay: .gdsfs/trace records the order
// files were opened; a fresh mount with staging.replay stages them in that
// order (one at a time with readahead_files: 1, so the order of loads is
// the trace's) before anything opens them; `gdsfs warmup --trace` does the
// same on demand through .gdsfs/replay.
func TestTraceRecordAndReplay(t *testing.T) {
	need(t, "getfattr")
	src, rels := shardTree(t, 20, 256<<10)
	var order []string
	for _, i := range []int{7, 2, 19, 0, 11, 5, 16, 3} {
		order = append(order, rels[i])
	}
	rec := startMount(t, src, "staging.trace_entries=64", "staging.prefetch=manual")
	for _, rel := range order {
		sh(t, "head -c 1 "+rec.path(rel)+" > /dev/null")
	}
	text := rec.control("trace")
	if got := tracePaths(text); !slices.Equal(got, order) {
		t.Fatalf("trace lists %v, want the opens' order %v:\n%s", got, order, text)
	}
	if !strings.HasPrefix(text, "# gdsfs-trace 1\n# mount: "+rec.mnt+"\n# source: "+src+"\n") {
		t.Fatalf("trace header:\n%s", text)
	}
	trace := filepath.Join(t.TempDir(), "epoch.trace")
	if err := os.WriteFile(trace, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	rec.stop()

	m := startMount(t, src, "staging.replay="+trace, "staging.readahead_files=1", "log.level=debug")
	for _, rel := range order {
		waitState(t, m.path(rel), "resident")
	}
	if got := stagedOrder(m.log.String()); !slices.Equal(got, order) {
		t.Fatalf("staged in the order %v, want the trace's %v; the daemon's log:\n%s", got, order, m.log.String())
	}
	if got := m.control("trace"); !strings.Contains(got, "# no trace recorded: staging.trace_entries is 0\n") {
		t.Fatalf(".gdsfs/trace with trace_entries 0:\n%s", got)
	}

	w := startMount(t, src)
	out, err := exec.Command(bins.gdsfs, "warmup", "--trace", trace).CombinedOutput()
	if err == nil || !strings.Contains(string(out), rec.mnt+" is not a gdsfs mount point") {
		t.Fatalf("warmup --trace without MOUNTPOINT, the trace's mount gone: %v\n%s", err, out)
	}
	out, err = exec.Command(bins.gdsfs, "warmup", "--trace", trace, "--wait", w.mnt).CombinedOutput()
	if err != nil {
		t.Fatalf("warmup --trace: %v\n%s", err, out)
	}
	for _, rel := range order {
		if st := xattr(t, w.path(rel), "state"); st != "resident" {
			t.Fatalf("%s is %q after warmup --trace --wait", rel, st)
		}
	}
	if st := xattr(t, w.path(rels[1]), "state"); st != "absent" {
		t.Fatalf("%s, not in the trace, is %q", rels[1], st)
	}
}

// tracePaths is the paths of a trace file's text.
func tracePaths(text string) []string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if l != "" && !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	return out
}
