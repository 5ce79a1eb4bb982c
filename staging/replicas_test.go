package staging

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"syscall"
	"testing"

	"github.com/gdsfs/gdsfs/gpu"
	"github.com/gdsfs/gdsfs/gpu/host"
	"github.com/gdsfs/gdsfs/internal/units"
)

// Replicas on several host devices (host0 .. hostN-1): placement,
// accounting and eviction per device, device-to-device copies, split
// ingest and invalidation of every replica.

// hostDevs opens n host devices with 64 KiB chunks.
func hostDevs(n int) []gpu.Device {
	var out []gpu.Device
	for _, d := range host.OpenN(gpu.Options{ChunkSize: 64 << 10}, n) {
		out = append(out, d)
	}
	return out
}

// replicaCache is a cache over n host devices of capacity bytes each;
// tune adjusts the options first.
func replicaCache(t *testing.T, n int, capacity int64, tune func(*Options, *IOOptions)) (*Cache, string) {
	t.Helper()
	src := t.TempDir()
	opts, io := testOptions()
	opts.Capacity = units.Share{Bytes: units.Size(capacity)}
	opts.Prefetch = PrefetchManual
	opts.RacyWindow = 0
	io.TaskSize = 16 << 10
	if tune != nil {
		tune(&opts, &io)
	}
	return newCache(t, src, opts, io, hostDevs(n)...), src
}

func acquireOn(t *testing.T, c *Cache, rel, dev string) *Lease {
	t.Helper()
	l, err := c.Acquire(context.Background(), Request{Rel: rel, Device: dev})
	if err != nil {
		t.Fatalf("acquire %s on %q: %v", rel, dev, err)
	}
	return l
}

func checkLease(t *testing.T, l *Lease, want []byte, device string) {
	t.Helper()
	if l.Device() != device {
		t.Fatalf("%s: leased on %s, want %s", l.Path(), l.Device(), device)
	}
	if got := regionBytes(t, l.Region()); !bytes.Equal(got, want) {
		t.Fatalf("%s on %s: bytes differ from the file", l.Path(), device)
	}
}

func deviceStats(c *Cache, name string) DeviceStats {
	for _, d := range c.Stats().Devices {
		if d.Name == name {
			return d
		}
	}
	return DeviceStats{}
}

// A lease names its device and gets the replica there: the second device's
// replica is copied device to device, counted against that device's
// capacity, and holds the same bytes and generation.
func TestReplicaOnTheDeviceAsked(t *testing.T) {
	c, src := replicaCache(t, 2, 1<<20, nil)
	data := randomBytes(200<<10, 1)
	writeFile(t, src, "w.bin", data)
	rec := record(t, c)

	l0 := acquireOn(t, c, "w.bin", "host0")
	defer l0.Release()
	checkLease(t, l0, data, "host0")
	l1 := acquireOn(t, c, "w.bin", "1") // by ordinal
	defer l1.Release()
	checkLease(t, l1, data, "host1")
	if l0.Generation() != l1.Generation() {
		t.Errorf("replicas of one version have generations %d and %d", l0.Generation(), l1.Generation())
	}
	ev := rec.waitFor(t, "w.bin", StateResident)
	if ev.Device != "host0" || ev.LoadPath != PathHost {
		t.Errorf("first resident event: %+v, want host0 read from SOURCE", ev)
	}
	ev = rec.waitFor(t, "w.bin", StateResident)
	if ev.Device != "host1" || ev.LoadPath != PathPeer {
		t.Errorf("second resident event: %+v, want host1 copied from host0", ev)
	}
	need := c.slots[0].need(int64(len(data)), int64(c.opts.ChunkSize))
	for _, name := range []string{"host0", "host1"} {
		d := deviceStats(c, name)
		if d.UsedBytes != need || d.StagedFiles != 1 || d.LeasesPinned != 1 {
			t.Errorf("%s: %+v, want %d bytes used by one staged file with one lease", name, d, need)
		}
	}
	st := c.Stats()
	if st.BytesHost != uint64(len(data)) || st.BytesPeer != uint64(len(data)) {
		t.Errorf("bytes_host %d, bytes_peer %d: want the file read once and copied once (%d)", st.BytesHost, st.BytesPeer, len(data))
	}
	// A lease that names no device is served by the first replica.
	l := acquireOn(t, c, "w.bin", "")
	defer l.Release()
	if l.Device() != "host0" {
		t.Errorf("a lease naming no device got %s", l.Device())
	}
}

// Under placement node a lease gets the copy wherever it is; a file staged
// nowhere is staged on the device named.
func TestPlacementNode(t *testing.T) {
	c, src := replicaCache(t, 2, 1<<20, func(o *Options, _ *IOOptions) { o.Placement = PlacementNode })
	a, b := randomBytes(70<<10, 2), randomBytes(90<<10, 3)
	writeFile(t, src, "a.bin", a)
	writeFile(t, src, "b.bin", b)
	l := acquireOn(t, c, "a.bin", "host0")
	l.Release()
	l = acquireOn(t, c, "a.bin", "host1")
	checkLease(t, l, a, "host0")
	l.Release()
	l = acquireOn(t, c, "b.bin", "host1")
	checkLease(t, l, b, "host1")
	l.Release()
	if n := len(c.Entries()); n != 2 {
		t.Errorf("%d entries, want one copy of each file", n)
	}
}

// Each device's replica is evicted on its own: room made on one device
// leaves the replica on the other, and EvictOn drops only the one named.
func TestReplicaEvictionPerDevice(t *testing.T) {
	size := 160 << 10 // one file per device fits
	c, src := replicaCache(t, 2, 256<<10, nil)
	a, b := randomBytes(size, 4), randomBytes(size, 5)
	writeFile(t, src, "a.bin", a)
	writeFile(t, src, "b.bin", b)
	ctx := context.Background()
	if _, err := c.StageOn(ctx, "a.bin", []string{"all"}); err != nil {
		t.Fatal(err)
	}
	rec := record(t, c)
	if _, err := c.StageOn(ctx, "b.bin", []string{"host0"}); err != nil {
		t.Fatal(err)
	}
	ev := rec.waitFor(t, "a.bin", StateAbsent)
	if ev.Device != "host0" || ev.Reason != "evicted" {
		t.Errorf("eviction event %+v, want a.bin evicted from host0", ev)
	}
	if d := deviceStats(c, "host0"); d.Evictions != 1 || d.StagedFiles != 1 {
		t.Errorf("host0: %+v, want one eviction and b.bin alone", d)
	}
	l := acquireOn(t, c, "a.bin", "host1")
	checkLease(t, l, a, "host1") // still resident there: a hit
	if err := c.EvictOn("a.bin", []string{"host1"}); !errors.Is(err, syscall.EBUSY) {
		t.Errorf("evicting a leased replica: %v, want EBUSY", err)
	}
	l.Release()
	if err := c.EvictOn("a.bin", []string{"host1"}); err != nil {
		t.Fatal(err)
	}
	if err := c.EvictOn("a.bin", nil); !errors.Is(err, syscall.ENOENT) {
		t.Errorf("evicting a file staged nowhere: %v, want ENOENT", err)
	}
	if d := deviceStats(c, "host1"); d.UsedBytes != 0 || d.Evictions != 1 {
		t.Errorf("host1: %+v, want empty after one eviction", d)
	}
	if err := c.EvictOn("b.bin", []string{"host7"}); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("evicting on an unknown device: %v, want EINVAL", err)
	}
}

// A change drops every replica at once: through the mount, and by the
// file's new identity at the next request.
func TestReplicasInvalidatedTogether(t *testing.T) {
	c, src := replicaCache(t, 3, 1<<20, nil)
	data := randomBytes(100<<10, 6)
	writeFile(t, src, "c.bin", data)
	ctx := context.Background()
	if _, err := c.StageOn(ctx, "c.bin", []string{"all"}); err != nil {
		t.Fatal(err)
	}
	rec := record(t, c)
	c.Changed("c.bin")
	gone := map[string]bool{}
	for range 3 {
		gone[rec.waitFor(t, "c.bin", StateAbsent).Device] = true
	}
	if len(gone) != 3 || len(c.Entries()) != 0 {
		t.Fatalf("after Changed: absent on %v, entries %v; want all three replicas gone", gone, c.Entries())
	}
	if _, err := c.StageOn(ctx, "c.bin", []string{"0", "2"}); err != nil {
		t.Fatal(err)
	}
	newer := randomBytes(120<<10, 7)
	writeFile(t, src, "c.bin", newer)
	l := acquireOn(t, c, "c.bin", "host2")
	defer l.Release()
	checkLease(t, l, newer, "host2")
	for _, e := range c.Entries() {
		if e.Size != int64(len(newer)) {
			t.Errorf("a replica of the old file is still there: %+v", e)
		}
	}
}

// A file wanted on several devices is read once from SOURCE: each device
// reads its share, and the shares are exchanged device to device.
func TestSplitIngest(t *testing.T) {
	for _, n := range []int{2, 3} {
		c, src := replicaCache(t, n, 4<<20, nil)
		data := randomBytes(1<<20+5000, 8)
		writeFile(t, src, "s.bin", data)
		rec := record(t, c)
		var mu sync.Mutex
		jobs := 0
		c.hooks.queued = func(string, bool) { mu.Lock(); jobs++; mu.Unlock() }
		infos, err := c.StageOn(context.Background(), "s.bin", []string{"all"})
		if err != nil {
			t.Fatal(err)
		}
		for i := range n {
			ev := rec.waitFor(t, "s.bin", StateLoading)
			if ev.Reason != "split ingest" {
				t.Errorf("n=%d: loading event %d: %+v, want a split ingest", n, i, ev)
			}
		}
		var read, peer uint64
		for i, info := range infos {
			if info.State != StateResident || info.Device != c.slots[i].dev.Name() {
				t.Errorf("n=%d: replica %d: %+v", n, i, info)
			}
			d := c.Stats().Devices[i]
			if d.BytesRead == 0 || d.BytesRead+d.BytesPeer != uint64(len(data)) {
				t.Errorf("n=%d: %s read %d and was copied %d bytes: want a share of the file, the rest copied", n, d.Name, d.BytesRead, d.BytesPeer)
			}
			read, peer = read+d.BytesRead, peer+d.BytesPeer
			l := acquireOn(t, c, "s.bin", d.Name)
			checkLease(t, l, data, d.Name)
			l.Release()
		}
		st := c.Stats()
		if read != uint64(len(data)) || st.SplitLoads != 1 || jobs != n {
			t.Errorf("n=%d: %d bytes read from SOURCE in %d jobs, split_loads %d: want the file read once, one share per device",
				n, read, jobs, st.SplitLoads)
		}
		if peer != uint64((n-1)*len(data)) || st.BytesPeer != peer {
			t.Errorf("n=%d: %d bytes copied device to device (stats %d), want %d", n, peer, st.BytesPeer, (n-1)*len(data))
		}
	}
}

// Without peer copies (staging.peer_copy off, or a pair without peer
// access) every replica is read from SOURCE.
func TestReplicasFromSourceWithoutPeerAccess(t *testing.T) {
	c, src := replicaCache(t, 2, 4<<20, func(o *Options, _ *IOOptions) { o.PeerCopy = PeerOff })
	data := randomBytes(300<<10, 9)
	writeFile(t, src, "p.bin", data)
	infos, err := c.StageOn(context.Background(), "p.bin", []string{"all"})
	if err != nil {
		t.Fatal(err)
	}
	for _, info := range infos {
		if info.LoadPath != PathHost {
			t.Errorf("%+v: want read from SOURCE", info)
		}
	}
	if st := c.Stats(); st.BytesHost != uint64(2*len(data)) || st.BytesPeer != 0 || st.SplitLoads != 0 {
		t.Errorf("bytes_host %d, bytes_peer %d, split_loads %d: want each replica read from SOURCE", st.BytesHost, st.BytesPeer, st.SplitLoads)
	}
	for _, d := range c.Stats().Devices {
		if len(d.Peers) != 0 {
			t.Errorf("%s lists peers %v with peer_copy off", d.Name, d.Peers)
		}
	}
	l := acquireOn(t, c, "p.bin", "host1")
	checkLease(t, l, data, "host1")
	l.Release()
}

// Two consumers on two devices asking at once: one read from SOURCE, one
// copy (the second request finds the first's load and copies from it).
func TestConcurrentLeasesOnTwoDevices(t *testing.T) {
	c, src := replicaCache(t, 2, 4<<20, nil)
	data := randomBytes(700<<10, 10)
	writeFile(t, src, "q.bin", data)
	var wg sync.WaitGroup
	for _, dev := range []string{"host0", "host1"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := c.Acquire(context.Background(), Request{Rel: "q.bin", Device: dev})
			if err != nil {
				t.Error(err)
				return
			}
			defer l.Release()
			if l.Device() != dev || !bytes.Equal(regionBytes(t, l.Region()), data) {
				t.Errorf("lease on %s: device %s or bytes wrong", dev, l.Device())
			}
		}()
	}
	wg.Wait()
	if st := c.Stats(); st.BytesHost != uint64(len(data)) || st.BytesPeer != uint64(len(data)) {
		t.Errorf("bytes_host %d, bytes_peer %d: want one read and one copy of %d", st.BytesHost, st.BytesPeer, len(data))
	}
}

// A prefetch naming devices stages a replica on each; until they are all
// resident the file reads as loading.
func TestPrefetchOnDevices(t *testing.T) {
	c, src := replicaCache(t, 2, 4<<20, nil)
	data := randomBytes(50<<10, 11)
	writeFile(t, src, "r.bin", data)
	done := make(chan string, 4)
	c.hooks.prefetchDone = func(rel string) { done <- rel }
	if _, err := c.StageOn(context.Background(), "r.bin", []string{"host0"}); err != nil {
		t.Fatal(err)
	}
	if ok, err := c.PrefetchOn("r.bin", []string{"nope"}); ok || !errors.Is(err, syscall.EINVAL) {
		t.Errorf("prefetch on an unknown device: %v %v, want EINVAL", ok, err)
	}
	if ok, err := c.PrefetchOn("r.bin", []string{"0", "1"}); !ok || err != nil {
		t.Fatalf("prefetch: %v %v", ok, err)
	}
	finished := false
	if st, _ := c.Attr("r.bin"); st != StateLoading {
		// the worker may already have finished: only then resident
		select {
		case <-done:
			finished = true
		default:
			t.Errorf("state %s while a replica is queued, want loading", st)
		}
	}
	if !finished {
		<-done
	}
	if st, _ := c.Attr("r.bin"); st != StateResident {
		t.Errorf("state %s after the prefetch, want resident", st)
	}
	if d := deviceStats(c, "host1"); d.StagedFiles != 1 || d.BytesPeer != uint64(len(data)) {
		t.Errorf("host1: %+v, want the replica copied from host0", d)
	}
}

// A device the cache does not stage onto is only a preference: the lease
// is served where the file is.
func TestLeaseOnUnknownDevice(t *testing.T) {
	c, src := replicaCache(t, 2, 4<<20, nil)
	data := randomBytes(10<<10, 12)
	writeFile(t, src, "u.bin", data)
	l, err := c.Acquire(context.Background(), Request{Rel: "u.bin", Device: "GPU-00000000-0000-0000-0000-000000000000"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	if !bytes.Equal(regionBytes(t, l.Region()), data) {
		t.Fatal("bytes differ")
	}
	if _, err := c.slotsFor([]string{"GPU-x"}); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("slotsFor an unknown device: %v", err)
	}
	if s, err := c.slotsFor([]string{"HOST1", "1", "all"}); err != nil || len(s) != 2 {
		t.Errorf("slotsFor(HOST1, 1, all): %v %v, want every device", s, err)
	}
}
