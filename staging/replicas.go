package staging

// Replicas: a file may be staged on several devices at once, one entry per
// device (slot), each counted against its own device's capacity, in its
// own device's LRU, evicted on its own, and invalidated together with the
// others when the file changes (every replica is indexed for change
// events, and Changed and checkIdentity drop them all).
//
// Where a request is served (staging.placement): a request that names a
// device gets the replica there under PlacementReplica, made if needed:
// copied device to device from a replica on another device where the
// pair has peer access (peers.go), else read from SOURCE. Under
// PlacementNode it gets any replica, and only a file staged nowhere is
// staged on the device named. Explicit stagings that name devices
// (warmup --gpus, prefetch lines with gpus=) always make the replicas
// they name. A request that names no device gets the first resident
// replica in staging.gpus order, or a new entry on the device with the
// most room.

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/gdsfs/gdsfs/gpu"
)

// copies is one file's entries, indexed by slot index; nil where the file
// has none.
type copies []*entry

// replicasLocked returns rel's attached entries in slot order. Cache.mu
// must be held.
func (c *Cache) replicasLocked(rel string) []*entry {
	var out []*entry
	for _, e := range c.entries[rel] {
		if e != nil {
			out = append(out, e)
		}
	}
	return out
}

// onLocked returns rel's attached entry on s, or nil. Cache.mu must be
// held.
func (c *Cache) onLocked(rel string, s *slot) *entry {
	if cs := c.entries[rel]; cs != nil {
		return cs[s.index]
	}
	return nil
}

// attachLocked makes e rel's entry on its slot, where there is none.
// Cache.mu must be held.
func (c *Cache) attachLocked(e *entry) {
	cs := c.entries[e.rel]
	if cs == nil {
		cs = make(copies, len(c.slots))
		c.entries[e.rel] = cs
	}
	cs[e.slot.index] = e
}

// attachedLocked says whether e is still rel's entry on its slot.
// Cache.mu must be held.
func (c *Cache) attachedLocked(e *entry) bool { return c.onLocked(e.rel, e.slot) == e }

// unattachLocked removes e from the map; false when it was not there.
// Cache.mu must be held.
func (c *Cache) unattachLocked(e *entry) bool {
	cs := c.entries[e.rel]
	if cs == nil || cs[e.slot.index] != e {
		return false
	}
	cs[e.slot.index] = nil
	for _, x := range cs {
		if x != nil {
			return true
		}
	}
	delete(c.entries, e.rel)
	return true
}

// pickLocked chooses, among rel's live entries (loading or resident, of
// the file as it is now), the one a request for want serves from: the
// entry on want, when want is set and the request must be served there
// (exact, or PlacementReplica); otherwise want's if it has one, else the
// first resident, else the first loading. nil: none fits. Cache.mu must
// be held.
func (c *Cache) pickLocked(live []*entry, want *slot, exact bool) *entry {
	if want != nil {
		for _, e := range live {
			if e.slot == want {
				return e
			}
		}
		if exact || c.opts.Placement != PlacementNode {
			return nil
		}
	}
	for _, e := range live {
		if e.state == stResident {
			return e
		}
	}
	if len(live) > 0 {
		return live[0]
	}
	return nil
}

// sourceLocked returns a replica of o's file that a new entry on s can be
// copied from device to device: resident if there is one, else loading
// (the copy waits for it). nil: none, or no peer access. Cache.mu must be
// held.
func (c *Cache) sourceLocked(rel string, o *opened, s *slot) *entry {
	var loading *entry
	for _, e := range c.replicasLocked(rel) {
		if e.slot == s || !s.peer[e.slot.index] || e.id != o.id || e.bg != nil || e.changed {
			continue
		}
		switch e.state {
		case stResident:
			return e
		case stLoading:
			if loading == nil && e.src == nil {
				loading = e
			}
		}
	}
	return loading
}

// genLocked is the generation of a new entry of rel with identity id: a
// replica of bytes already staged on another device shares their
// generation (the same bytes); otherwise a new one. Cache.mu must be
// held.
func (c *Cache) genLocked(rel string, id identity) uint64 {
	for _, e := range c.replicasLocked(rel) {
		if e.id == id && e.state != stFailed {
			return e.gen
		}
	}
	c.gen++
	return c.gen
}

// slotOrdinal is the number a device is named by in staging.gpus and in
// gpus= lists: its CUDA ordinal, or its index on the host backend.
func slotOrdinal(s *slot) int {
	if s.dev.Kind() == gpu.KindCUDA {
		return s.dev.Ordinal()
	}
	return s.index
}

// slotFor finds the device spec names: "GPU-<uuid>" (any case), "host",
// "hostN", or an ordinal (slotOrdinal). ok is false when this cache
// stages onto no such device.
func (c *Cache) slotFor(spec string) (*slot, bool) {
	spec = strings.TrimSpace(spec)
	n, numErr := strconv.Atoi(spec)
	for _, s := range c.slots {
		switch {
		case numErr == nil && n == slotOrdinal(s):
			return s, true
		case numErr != nil && strings.EqualFold(spec, s.dev.Name()):
			return s, true
		}
	}
	return nil, false
}

// slotsFor resolves a list of device specs ("all": every device); nil for
// an empty list. Duplicates count once. An unknown device is an EINVAL
// error naming the devices there are.
func (c *Cache) slotsFor(specs []string) ([]*slot, error) {
	var out []*slot
	seen := map[*slot]bool{}
	for _, spec := range specs {
		if strings.EqualFold(strings.TrimSpace(spec), "all") {
			return c.slots, nil
		}
		s, ok := c.slotFor(spec)
		if !ok {
			return nil, errNoDevice(spec, c.deviceList())
		}
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out, nil
}

// deviceList names the devices as "0=GPU-..., 1=GPU-...".
func (c *Cache) deviceList() string {
	var parts []string
	for _, s := range c.slots {
		parts = append(parts, fmt.Sprintf("%d=%s", slotOrdinal(s), s.dev.Name()))
	}
	return strings.Join(parts, ", ")
}

// ParseDevices splits a device list as written after gpus= ("0,1",
// "all", "GPU-...,GPU-..."); an empty list is an error.
func ParseDevices(list string) ([]string, error) {
	var out []string
	for _, f := range strings.Split(list, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no device in %q: want ordinals (0,1), names (GPU-..., host0) or all", list)
	}
	return out, nil
}
