package staging

// Device to device: a replica is copied from a replica on another device
// (NVLink or PCIe peer-to-peer on CUDA; a memcpy between regions on the
// host backend) where the pair has peer access and staging.peer_copy
// allows; otherwise it is read from SOURCE like any load.
//
// Split ingest: a file wanted on several devices at once (StageOn, a
// prefetch that names devices) and staged on none of them is read once
// from SOURCE: the file's tasks are split into one contiguous share per
// device, each device's loader reads its share over its own host link,
// all at once, and each share, once loaded, is copied device to device
// into every other replica. N devices fill at up to N times one host
// link's rate; each replica is published (resident) when every share is
// in it.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/gdsfs/gdsfs/gpu"
	"github.com/gdsfs/gdsfs/internal/units"
	"github.com/gdsfs/gdsfs/staging/loader"
)

// openPeers learns which pairs of slots copy device to device, enabling
// peer access once per pair, and logs the topology found.
func (c *Cache) openPeers() {
	for i, a := range c.slots {
		for j := i + 1; j < len(c.slots); j++ {
			b := c.slots[j]
			ok, why := false, "staging.peer_copy is off"
			if c.opts.PeerCopy != PeerOff {
				ok, why = loader.PeerAccess(a.dev, b.dev)
			}
			a.peer[j], b.peer[i] = ok, ok
			if ok {
				c.log.Info("replicas copied device to device", zap.String("a", a.dev.Name()), zap.String("b", b.dev.Name()))
			} else {
				c.log.Info("replicas staged from SOURCE", zap.String("a", a.dev.Name()), zap.String("b", b.dev.Name()), zap.String("why", why))
			}
		}
	}
}

// fillFromPeer copies e's file into region from e.src once that is
// resident, and unpins e.src. done is false when e.src did not end
// resident (failed, changed, cancelled): the caller reads from SOURCE, and
// note says why.
func (c *Cache) fillFromPeer(e *entry, region gpu.Region) (path, note string, done bool, err error) {
	src := e.src
	defer c.unpin(src)
	select {
	case <-src.done:
	case <-c.ctx.Done():
		return PathPeer, "", true, fmt.Errorf("cache closing: %w", c.ctx.Err())
	}
	c.lock()
	r := src.region
	ok := src.state == stResident && !src.detached && src.id == e.id && r != nil
	c.unlock()
	from := src.slot.dev.Name()
	if !ok {
		return "", "the replica on " + from + " to copy from was not staged; read from SOURCE", false, nil
	}
	if err := loader.CopyPeer(e.slot.dev, region, src.slot.dev, r, loader.Span{Off: 0, End: e.id.size}); err != nil {
		return PathPeer, "", true, err
	}
	e.peerBytes = e.id.size
	return PathPeer, "copied from " + from, true, nil
}

// splitLoad is one split ingest: its entries (one per device, in share
// order) and the file.
type splitLoad struct {
	es []*entry
	f  *os.File
}

// startSplit starts a split ingest of rel onto on, when it can start now:
// two devices or more, peer access between every pair, none of them
// holding any replica of rel, at least one task per device, and room on
// each without waiting (nobody waits for room). Otherwise it does
// nothing: the requests that follow stage each device on their own
// (copying from the first replica where they can).
func (c *Cache) startSplit(rel string, on []*slot, at uint64) {
	if len(on) < 2 || !c.allPeers(on) {
		return
	}
	c.watch.drain() // events of writes that completed before: handled first
	o, err := c.openEligible(rel)
	if err != nil {
		return
	}
	if (o.id.size+int64(c.io.TaskSize)-1)/int64(c.io.TaskSize) < int64(len(on)) {
		o.f.Close()
		return
	}
	c.lock()
	sl, regions := c.startSplitLocked(rel, o, on, at)
	c.unlockFree(regions...)
	if sl == nil {
		o.f.Close()
		return
	}
	go c.loadSplit(sl)
}

// allPeers says whether every pair of on copies device to device.
func (c *Cache) allPeers(on []*slot) bool {
	for _, a := range on {
		for _, b := range on {
			if a != b && !a.peer[b.index] {
				return false
			}
		}
	}
	return true
}

// startSplitLocked reserves room on every slot of on and creates their
// loading entries, pinned once each for the load; nil when any condition
// of startSplit fails (nothing reserved then). It returns the evicted
// regions to free after unlocking. Cache.mu must be held.
func (c *Cache) startSplitLocked(rel string, o *opened, on []*slot, at uint64) (*splitLoad, []gpu.Region) {
	if c.closed || c.handedOff || c.waiters.Len() > 0 || len(c.entries[rel]) > 0 {
		return nil, nil
	}
	need := make([]int64, len(on))
	fds := 0
	for i, s := range on {
		need[i] = s.need(o.id.size, int64(c.opts.ChunkSize))
		fds += s.dev.HeldDescriptors(o.id.size)
		eb, ef := s.evictableLocked()
		if need[i] > s.capacity-s.used+eb || fds > c.fdBudget-c.fdsUsed+ef {
			return nil, nil
		}
	}
	var regions []gpu.Region
	for i, s := range on {
		victims, ok := c.reserveLocked(s, need[i], s.dev.HeldDescriptors(o.id.size))
		regions = append(regions, c.detachVictimsLocked(victims)...)
		if !ok { // the descriptor budget, shared: give back what was taken
			for k := range i {
				on[k].used -= need[k]
				c.fdsUsed -= on[k].dev.HeldDescriptors(o.id.size)
			}
			c.wakeLocked()
			return nil, regions
		}
	}
	sl := &splitLoad{f: o.f}
	gen := c.genLocked(rel, o.id)
	for i, s := range on {
		e := &entry{
			rel: rel, id: o.id, fid: o.fid, events: o.events, slot: s, gen: gen, done: make(chan struct{}),
			state: stLoading, reserved: need[i], fds: s.dev.HeldDescriptors(o.id.size), lastUse: at, pins: 1,
		}
		c.attachLocked(e)
		c.indexLocked(e)
		c.emitLocked(e.eventLocked(stLoading, "split ingest"))
		sl.es = append(sl.es, e)
	}
	c.stats.misses.Add(1)
	c.stats.splitLoads.Add(1)
	c.wg.Add(1)
	return sl, regions
}

// loadSplit runs a split ingest and publishes every replica; then drops
// the load's pins.
func (c *Cache) loadSplit(sl *splitLoad) {
	defer c.wg.Done()
	defer sl.f.Close()
	start := time.Now()
	es := sl.es
	regions := make([]gpu.Region, len(es))
	err := c.waitRacy(es[0])
	for i, e := range es {
		if err == nil {
			regions[i], err = c.alloc(e)
		}
	}
	path, notes := "", make([]string, len(es))
	if err == nil {
		path, notes, err = c.fillSplit(sl, regions)
	}
	if err == nil {
		if now, _, ferr := fileIdentity(sl.f); ferr != nil || now != es[0].id {
			err = fmt.Errorf("its attributes changed: %w", errFileChanged)
		}
	}
	for i := range es {
		if err == nil {
			err = regions[i].Seal()
		}
	}
	dur := time.Since(start)
	for i, e := range es {
		c.publish(e, regions[i], path, notes[i], err, dur)
	}
	for _, e := range es {
		c.unpin(e)
	}
}

// fillSplit reads each share into its device's region, all at once, and
// copies each loaded share into every other region. It returns the load
// path of the reads and a note per replica.
func (c *Cache) fillSplit(sl *splitLoad, regions []gpu.Region) (string, []string, error) {
	es := sl.es
	sp := loader.Shares(es[0].id.size, int64(c.io.TaskSize), len(es))
	paths, notes, errs := make([]string, len(es)), make([]string, len(es)), make([]error, len(es))
	var wg sync.WaitGroup
	for i := range es {
		wg.Add(1)
		go func() {
			defer wg.Done()
			paths[i], notes[i], errs[i] = c.fillSpan(es[i], sl.f, regions[i], sp[i])
			for j := range es {
				if j != i && errs[i] == nil {
					errs[i] = loader.CopyPeer(es[j].slot.dev, regions[j], es[i].slot.dev, regions[i], sp[i])
				}
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return paths[0], notes, err
	}
	for i, e := range es {
		n := sp[i].End - sp[i].Off
		e.peerBytes = e.id.size - n
		notes[i] = loader.JoinNote(fmt.Sprintf("split ingest: %s of %s read here from SOURCE, the rest copied from %d other devices",
			units.HumanBytes(n), units.HumanBytes(e.id.size), len(es)-1), notes[i])
	}
	return paths[0], notes, nil
}

// StageOn makes rel resident on each device devs names ("all", ordinals,
// names; none: anywhere, as Stage), whatever staging.placement says, and
// describes each replica. A file staged on none of them is read once from
// SOURCE, split between the devices (split ingest); otherwise the missing
// replicas are copied from one that exists. It waits, bounded by ctx.
func (c *Cache) StageOn(ctx context.Context, rel string, devs []string) ([]Info, error) {
	on, err := c.slotsFor(devs)
	if err != nil {
		return nil, err
	}
	return c.stageOn(ctx, rel, on, true, c.ra.Tick())
}

// stageOn is StageOn for resolved slots; wait says whether to wait for
// room.
func (c *Cache) stageOn(ctx context.Context, rel string, on []*slot, wait bool, at uint64) ([]Info, error) {
	if len(on) == 0 {
		info, err := c.stageOne(ctx, rel, nil, wait, at)
		if err != nil {
			return nil, err
		}
		return []Info{info}, nil
	}
	c.startSplit(rel, on, at)
	infos, errs := make([]Info, len(on)), make([]error, len(on))
	var wg sync.WaitGroup
	for i, s := range on {
		wg.Add(1)
		go func() {
			defer wg.Done()
			infos[i], errs[i] = c.stageOne(ctx, rel, s, wait, at)
		}()
	}
	wg.Wait()
	return infos, errors.Join(errs...)
}
