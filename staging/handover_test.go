package staging

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"os"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/gdsfs/gdsfs/gpu"
	"github.com/gdsfs/gdsfs/internal/units"
)

// Hand-over between two caches of one SOURCE, as between two daemons:
// the state goes through JSON, the descriptors are the exported dups.

// handOverOptions are testOptions with staging on request only and no
// racy window (TestHandOverRacyStamp sets one).
func handOverOptions() (Options, IOOptions) {
	opts, io := testOptions()
	opts.ChunkSize = 256 << 10
	opts.Prefetch = PrefetchManual
	opts.RacyWindow = 0
	return opts, io
}

// jsonRoundTrip passes st through encoding/json.
func jsonRoundTrip(t *testing.T, st CacheState) CacheState {
	t.Helper()
	raw, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	var out CacheState
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// adopt hands st and files to b, closes the files (b holds its own) and
// checks that the report adds up.
func adopt(t *testing.T, b *Cache, st CacheState, files []*os.File) AdoptReport {
	t.Helper()
	defer closeFiles(files)
	rep, err := b.Adopt(jsonRoundTrip(t, st), files)
	if err != nil {
		t.Fatalf("Adopt: %v", err)
	}
	if rep.Adopted+len(rep.Dropped) != len(st.Entries) {
		t.Fatalf("report %+v for %d entries", rep, len(st.Entries))
	}
	return rep
}

// TestHandOverServesWithoutReading: the successor serves every file the
// predecessor had resident, with its bytes, load path and generation,
// without allocating or reading anything; the counters continue; a
// consumer's descriptors of the predecessor's region stay right after it
// abandons.
func TestHandOverServesWithoutReading(t *testing.T) {
	src := t.TempDir()
	opts, io := handOverOptions()
	files := map[string][]byte{
		"a.bin":     randomBytes(1<<20+12345, 1), // five chunks
		"d/b.bin":   randomBytes(4095, 2),
		"d/e/c.bin": randomBytes(0, 3),
	}
	for rel, data := range files {
		writeFile(t, src, rel, data)
	}
	a := newCache(t, src, opts, io, newFake(int64(opts.ChunkSize)))
	gens := map[string]uint64{}
	for rel := range files {
		if _, err := a.Stage(context.Background(), rel); err != nil {
			t.Fatal(err)
		}
		l, err := a.Acquire(context.Background(), Request{Rel: rel})
		if err != nil {
			t.Fatal(err)
		}
		gens[rel] = l.Generation()
		l.Release()
	}
	held, err := a.Acquire(context.Background(), Request{Rel: "a.bin"}) // a consumer's, across the hand-over
	if err != nil {
		t.Fatal(err)
	}
	mapped, err := held.Export()
	if err != nil {
		t.Fatal(err)
	}
	defer closeFiles(mapped)
	before := a.Stats()

	dev := newFake(int64(opts.ChunkSize))
	b := newCache(t, src, opts, io, dev)
	rec := record(t, b)
	st, fds, err := a.Handoff()
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Entries) != len(files) {
		t.Fatalf("handed over %d entries, want %d", len(st.Entries), len(files))
	}
	rep := adopt(t, b, st, fds)
	var size int64
	for _, data := range files {
		size += int64(len(data))
	}
	if rep.Adopted != len(files) || rep.Bytes != size || len(rep.Dropped) != 0 {
		t.Fatalf("report %+v, want %d files of %d bytes adopted", rep, len(files), size)
	}
	held.Release() // the old daemon ends its lease...
	a.Abandon()    // ...and its hold on every region
	got := make([]byte, 4096)
	if _, err := mapped[4].ReadAt(got, 0); err != nil || string(got) != string(files["a.bin"][4<<18:4<<18+4096]) {
		t.Fatalf("a consumer's descriptor after the old daemon left: %v", err)
	}

	for rel, data := range files {
		ev := rec.waitFor(t, rel, StateResident)
		if !ev.HandedOver || ev.Duration != 0 || ev.LoadPath != PathHost {
			t.Fatalf("%s: event %+v, want handed over, no load time, load path host", rel, ev)
		}
		checkStaged(t, b, rel, data)
		l, err := b.Acquire(context.Background(), Request{Rel: rel})
		if err != nil {
			t.Fatal(err)
		}
		if l.Generation() != gens[rel] {
			t.Errorf("%s: generation %d, the predecessor's was %d", rel, l.Generation(), gens[rel])
		}
		l.Release()
	}
	if n := dev.allocs.Load(); n != 0 {
		t.Fatalf("the successor allocated %d regions", n)
	}
	s := b.Stats()
	if s.BytesHost != before.BytesHost || s.Misses != before.Misses || s.Devices[0].BytesRead != before.Devices[0].BytesRead {
		t.Fatalf("bytes_host %d misses %d bytes_read %d, want the predecessor's %d %d %d: nothing read again",
			s.BytesHost, s.Misses, s.Devices[0].BytesRead, before.BytesHost, before.Misses, before.Devices[0].BytesRead)
	}
	if s.Hits != before.Hits+2*uint64(len(files)) || s.LeasesTotal != before.LeasesTotal+2*uint64(len(files)) {
		t.Fatalf("hits %d leases_total %d, want the predecessor's %d and %d continued", s.Hits, s.LeasesTotal, before.Hits, before.LeasesTotal)
	}
	if s.StagedFiles != len(files) || s.UsedBytes != before.UsedBytes || s.DescriptorsUsed != before.DescriptorsUsed {
		t.Fatalf("successor holds %d files, %d bytes, %d descriptors; the predecessor %d, %d, %d",
			s.StagedFiles, s.UsedBytes, s.DescriptorsUsed, before.StagedFiles, before.UsedBytes, before.DescriptorsUsed)
	}
	for _, info := range b.Entries() {
		if info.LoadPath != PathHost || info.State != StateResident {
			t.Fatalf("entry %+v", info)
		}
	}
}

// TestHandOverDropsChangedFile: a file changed between the hand-over and
// the adoption is not adopted; the next lease reads its new bytes.
func TestHandOverDropsChangedFile(t *testing.T) {
	src := t.TempDir()
	opts, io := handOverOptions()
	same, old := randomBytes(300<<10, 1), randomBytes(200<<10, 2)
	writeFile(t, src, "same", same)
	writeFile(t, src, "changed", old)
	a := newCache(t, src, opts, io)
	for _, rel := range []string{"same", "changed"} {
		if _, err := a.Stage(context.Background(), rel); err != nil {
			t.Fatal(err)
		}
	}
	dev := newFake(int64(opts.ChunkSize))
	b := newCache(t, src, opts, io, dev)
	st, fds, err := a.Handoff()
	if err != nil {
		t.Fatal(err)
	}
	changed := randomBytes(200<<10+1, 3) // another size: a change the identity always shows
	writeFile(t, src, "changed", changed)
	rep := adopt(t, b, st, fds)
	a.Abandon()
	if rep.Adopted != 1 || len(rep.Dropped) != 1 || rep.Dropped[0].Path != "changed" || !strings.Contains(rep.Dropped[0].Reason, "changed") {
		t.Fatalf("report %+v, want same adopted and changed dropped as changed", rep)
	}
	checkStaged(t, b, "same", same)
	checkStaged(t, b, "changed", changed)
	if n := dev.allocs.Load(); n != 1 {
		t.Fatalf("%d allocations, want 1: the changed file read again", n)
	}
	if s := b.Stats(); s.BytesHost != uint64(len(same)+len(old)+len(changed)) {
		t.Fatalf("bytes_host %d, want the predecessor's two files and the changed one again", s.BytesHost)
	}
}

// TestHandOverChangedWhileAdopted: a file changed after Adopt checked its
// identity, before its entry could hear of change events, is dropped.
func TestHandOverChangedWhileAdopted(t *testing.T) {
	src := t.TempDir()
	opts, io := handOverOptions()
	writeFile(t, src, "f", randomBytes(100<<10, 1))
	a := newCache(t, src, opts, io)
	if _, err := a.Stage(context.Background(), "f"); err != nil {
		t.Fatal(err)
	}
	b := newCache(t, src, opts, io)
	rec := record(t, b)
	changed := randomBytes(100<<10+1, 2)
	b.hooks.adopting = func(rel string) { writeFile(t, src, rel, changed) }
	st, fds, err := a.Handoff()
	if err != nil {
		t.Fatal(err)
	}
	rep := adopt(t, b, st, fds)
	a.Abandon()
	if rep.Adopted != 0 || len(rep.Dropped) != 1 || !strings.Contains(rep.Dropped[0].Reason, "changed") {
		t.Fatalf("report %+v, want f dropped as changed", rep)
	}
	rec.waitFor(t, "f", StateAbsent)
	checkStaged(t, b, "f", changed)
}

// TestHandOverRacyStamp: a file whose stamp is younger than
// staging.racy_window when the predecessor last saw it is not adopted: a
// write since, within the timestamp granularity, could have left its
// identity as it was.
func TestHandOverRacyStamp(t *testing.T) {
	src := t.TempDir()
	opts, io := handOverOptions()
	data := randomBytes(100<<10, 1)
	writeFile(t, src, "f", data)
	a := newCache(t, src, opts, io)
	if _, err := a.Stage(context.Background(), "f"); err != nil {
		t.Fatal(err)
	}
	opts.RacyWindow = time.Minute
	dev := newFake(int64(opts.ChunkSize))
	b := newCache(t, src, opts, io, dev)
	st, fds, err := a.Handoff()
	if err != nil {
		t.Fatal(err)
	}
	rep := adopt(t, b, st, fds)
	a.Abandon()
	if rep.Adopted != 0 || len(rep.Dropped) != 1 || !strings.Contains(rep.Dropped[0].Reason, "racy_window") {
		t.Fatalf("report %+v, want f dropped for its recent stamp", rep)
	}
}

// TestHandOverVersion: a state of another version is refused whole,
// naming both versions.
func TestHandOverVersion(t *testing.T) {
	src := t.TempDir()
	opts, io := handOverOptions()
	writeFile(t, src, "f", randomBytes(1000, 1))
	a := newCache(t, src, opts, io)
	if _, err := a.Stage(context.Background(), "f"); err != nil {
		t.Fatal(err)
	}
	st, fds, err := a.Handoff()
	if err != nil {
		t.Fatal(err)
	}
	defer closeFiles(fds)
	st.Version = 999
	b := newCache(t, src, opts, io)
	_, err = b.Adopt(jsonRoundTrip(t, st), fds)
	if err == nil || !strings.Contains(err.Error(), "version 999") || !strings.Contains(err.Error(), "version 1") {
		t.Fatalf("Adopt of version 999: %v, want a refusal naming 999 and 1", err)
	}
	if s := b.Stats(); s.StagedFiles != 0 || s.Hits != 0 {
		t.Fatalf("a refused state left %d files, %d hits", s.StagedFiles, s.Hits)
	}
}

// noImport is a device that cannot import regions.
type noImport struct{ gpu.Device }

// TestHandOverDropsWhatItCannotUse: entries on a device the successor
// lacks, or one without an importer, or beyond the room, are dropped with
// their reason; the rest is adopted, in another chunk layout too.
func TestHandOverDropsWhatItCannotUse(t *testing.T) {
	for _, tc := range []struct {
		name string
		tune func(*Options, *[]gpu.Device)
		want string
	}{
		{"another device", func(o *Options, d *[]gpu.Device) { *d = hostDevs(2) }, "not among this daemon's (0=host0, 1=host1)"},
		{"no importer", func(o *Options, d *[]gpu.Device) { *d = []gpu.Device{noImport{newFake(int64(o.ChunkSize))}} }, "cannot take over"},
		{"room", func(o *Options, d *[]gpu.Device) {
			o.Capacity = units.Share{Bytes: 600 << 10}
			o.ChunkSize = 64 << 10 // the predecessor's 256 KiB chunks are taken as they are
		}, "no room on host"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := t.TempDir()
			opts, io := handOverOptions()
			writeFile(t, src, "big", randomBytes(500<<10, 1))
			writeFile(t, src, "small", randomBytes(200<<10, 2))
			a := newCache(t, src, opts, io)
			for _, rel := range []string{"small", "big"} { // big most recent: adopted first
				if _, err := a.Stage(context.Background(), rel); err != nil {
					t.Fatal(err)
				}
			}
			var devs []gpu.Device
			tc.tune(&opts, &devs)
			b := newCache(t, src, opts, io, devs...)
			st, fds, err := a.Handoff()
			if err != nil {
				t.Fatal(err)
			}
			if st.Entries[0].Path != "big" {
				t.Fatalf("entries %+v, want the most recently used first", st.Entries)
			}
			rep := adopt(t, b, st, fds)
			a.Abandon()
			if len(rep.Dropped) == 0 || !strings.Contains(rep.Dropped[len(rep.Dropped)-1].Reason, tc.want) {
				t.Fatalf("report %+v, want a drop saying %q", rep, tc.want)
			}
			if tc.name == "room" && (rep.Adopted != 1 || rep.Dropped[0].Path != "small") {
				t.Fatalf("report %+v, want big adopted and small dropped for room", rep)
			}
		})
	}
}

// TestHandOverReplicas: replicas on several devices are adopted each on
// its own device, with its own accounting.
func TestHandOverReplicas(t *testing.T) {
	a, src := replicaCache(t, 2, 4<<20, nil)
	data := randomBytes(300<<10, 1)
	writeFile(t, src, "r", data)
	if _, err := a.StageOn(context.Background(), "r", []string{"all"}); err != nil {
		t.Fatal(err)
	}
	opts, io := testOptions()
	opts.Capacity = units.Share{Bytes: 4 << 20}
	opts.Prefetch, opts.RacyWindow, io.TaskSize = PrefetchManual, 0, 16<<10
	b := newCache(t, src, opts, io, hostDevs(2)...)
	st, fds, err := a.Handoff()
	if err != nil {
		t.Fatal(err)
	}
	if rep := adopt(t, b, st, fds); rep.Adopted != 2 {
		t.Fatalf("report %+v, want both replicas adopted", rep)
	}
	a.Abandon()
	for _, dev := range []string{"host0", "host1"} {
		l := acquireOn(t, b, "r", dev)
		checkLease(t, l, data, dev)
		l.Release()
		if d := deviceStats(b, dev); d.StagedFiles != 1 || d.UsedBytes == 0 {
			t.Fatalf("%s: %+v", dev, d)
		}
	}
}

// TestHandOffResume: after Handoff the cache serves hits and starts no
// load; a lease that needs one waits and is served once Resume lets
// loads go on.
func TestHandOffResume(t *testing.T) {
	src := t.TempDir()
	opts, io := handOverOptions()
	old, fresh := randomBytes(100<<10, 1), randomBytes(100<<10, 2)
	writeFile(t, src, "old", old)
	writeFile(t, src, "new", fresh)
	c := newCache(t, src, opts, io)
	if _, err := c.Stage(context.Background(), "old"); err != nil {
		t.Fatal(err)
	}
	waiting := make(chan string, 1)
	c.hooks.waiting = func(rel string) { waiting <- rel }
	st, fds, err := c.Handoff()
	closeFiles(fds)
	if err != nil || len(st.Entries) != 1 {
		t.Fatalf("Handoff: %d entries, %v", len(st.Entries), err)
	}
	checkStaged(t, c, "old", old) // a hit: served
	done := make(chan error, 1)
	go func() {
		l, err := c.Acquire(context.Background(), Request{Rel: "new"})
		if err == nil {
			l.Release()
		}
		done <- err
	}()
	select {
	case rel := <-waiting:
		if rel != "new" {
			t.Fatalf("waiting for %s", rel)
		}
	case err := <-done:
		t.Fatalf("a lease that needed a load was answered during the hand-over (%v)", err)
	}
	if s := c.Stats(); s.LoadingFiles != 0 || s.StagedFiles != 1 {
		t.Fatalf("during the hand-over: %d loading, %d staged", s.LoadingFiles, s.StagedFiles)
	}
	if err := c.Resume(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("the lease after Resume: %v", err)
	}
	checkStaged(t, c, "new", fresh)
}

// TestSnapshotAndExportEntry: Snapshot stops nothing; ExportEntry hands
// one entry's state and descriptors, enough to adopt it.
func TestSnapshotAndExportEntry(t *testing.T) {
	src := t.TempDir()
	opts, io := handOverOptions()
	data := randomBytes(300<<10, 1)
	writeFile(t, src, "f", data)
	writeFile(t, src, "g", randomBytes(10, 2))
	a := newCache(t, src, opts, io)
	if _, err := a.Stage(context.Background(), "f"); err != nil {
		t.Fatal(err)
	}
	st, fds, err := a.Snapshot()
	closeFiles(fds)
	if err != nil || len(st.Entries) != 1 {
		t.Fatalf("Snapshot: %+v, %v", st, err)
	}
	if _, err := a.Stage(context.Background(), "g"); err != nil {
		t.Fatalf("a load after Snapshot: %v", err)
	}
	if _, _, err := a.ExportEntry("nope", "host"); !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("ExportEntry of an unstaged file: %v, want ENOENT", err)
	}
	es, fds, err := a.ExportEntry("f", "host")
	if err != nil {
		t.Fatal(err)
	}
	b := newCache(t, src, opts, io)
	st = CacheState{Version: CacheVersion, Entries: []EntryState{es}}
	if rep := adopt(t, b, st, fds); rep.Adopted != 1 {
		t.Fatalf("report %+v", rep)
	}
	checkStaged(t, b, "f", data)
}

// TestHandOverCountersNamed: every cumulative counter is handed over
// under a name (a new counter must be added to cumulative): the cache's,
// its slots', and its staging after reads' (handed over by the cache,
// under the same names with or without one).
func TestHandOverCountersNamed(t *testing.T) {
	check := func(v reflect.Value, named map[string]*atomic.Uint64) {
		have := map[unsafe.Pointer]bool{}
		for _, p := range named {
			have[unsafe.Pointer(p)] = true
		}
		for i := range v.NumField() {
			f := v.Field(i)
			if f.Type() == reflect.TypeFor[atomic.Uint64]() && !have[f.Addr().UnsafePointer()] {
				t.Errorf("%s.%s is not handed over", v.Type().Name(), v.Type().Field(i).Name)
			}
		}
	}
	var c counters
	check(reflect.ValueOf(&c).Elem(), c.cumulative())
	var s slot
	check(reflect.ValueOf(&s).Elem(), s.cumulative())

	src := t.TempDir()
	opts, io := handOverOptions()
	ar := newAfterRead(opts, nil)
	with := newCacheCfg(t, Config{Source: src, Options: opts, IO: io, AfterRead: ar})
	check(reflect.ValueOf(ar).Elem(), with.cumulative())
	without := newPlainCache(t, src, opts, io)
	if got, want := slices.Sorted(maps.Keys(without.cumulative())), slices.Sorted(maps.Keys(with.cumulative())); !slices.Equal(got, want) {
		t.Errorf("without a staging after reads the cache hands over %v, with one %v", got, want)
	}
}

// TestHandOverCarriesAfterReadCountersWithoutOne: a cache made without a
// staging after reads (Config.AfterRead nil) still shows and hands on
// its predecessor's deferred_opens and mapped_read_waits.
func TestHandOverCarriesAfterReadCountersWithoutOne(t *testing.T) {
	src := t.TempDir()
	writeFile(t, src, "f", randomBytes(4096, 1))
	opts, io := handOverOptions()
	opts.Prefetch, opts.DeferWhileRead = PrefetchOpen, true
	a := newCache(t, src, opts, io)
	a.Opened("f")
	a.Opened("f")
	if n := a.Stats().DeferredOpens; n != 2 {
		t.Fatalf("deferred_opens %d, want 2", n)
	}
	st, fds, err := a.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	closeFiles(fds)
	st.Entries = nil // the counters only
	b := newPlainCache(t, src, opts, io)
	adopt(t, b, st, nil)
	if n := b.Stats().DeferredOpens; n != 2 {
		t.Errorf("deferred_opens %d shown by the successor without a staging after reads, want the predecessor's 2", n)
	}
	next, _, err := b.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if n := next.Counters["deferred_opens"]; n != 2 {
		t.Errorf("deferred_opens %d handed on by it, want 2", n)
	}
	a.Closed("f")
	a.Closed("f")
}
