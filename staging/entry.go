package staging

import (
	"container/list"
	"fmt"
	"os"
	"sort"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/gpu"
	"github.com/gdsfs/gdsfs/staging/loader"
	"github.com/gdsfs/gdsfs/staging/triggers"
)

// Load paths, as counted in bytes_cufile, bytes_posix and bytes_host.
const (
	PathCuFile = loader.PathCuFile
	PathPOSIX  = loader.PathPOSIX
	PathHost   = loader.PathHost
	// PathPeer: copied device to device from a replica on another device.
	PathPeer = loader.PathPeer
)

// identity is what makes staged bytes valid for a file: if any field
// changes, the bytes are stale.
type identity struct {
	dev, ino     uint64
	size         int64
	mtime, ctime int64 // nanoseconds
}

func identityOf(st *unix.Stat_t) identity {
	return identity{
		dev: st.Dev, ino: st.Ino, size: st.Size,
		mtime: st.Mtim.Nano(), ctime: st.Ctim.Nano(),
	}
}

func fileIdentity(f *os.File) (identity, uint32, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return identity{}, 0, fmt.Errorf("fstat: %w", err)
	}
	return identityOf(&st), st.Mode, nil
}

// entry is one file's staging. Fields after mu-guarded are guarded by
// Cache.mu; the rest are fixed at creation.
type entry struct {
	rel    string
	id     identity
	fid    fid  // the file as fanotify names it, when events is set
	events bool // its filesystem's changes raise fanotify events
	slot   *slot
	gen    uint64
	done   chan struct{}      // closed when the load finished (resident or failed)
	ra     *loader.Background // a background load (background.go) or yielding (readers.go); nil: by a demand
	// src is the replica on another device this one is copied from
	// (peers.go), pinned by it until its load ends; nil: read from SOURCE.
	src *entry

	// guarded by Cache.mu
	state    state  // state.go
	path     string // load path taken or attempted
	reason   string // failed: why; resident: why cuFile was not used ("" if it was)
	err      error  // the load's error, when failed
	region   gpu.Region
	reserved int64 // device bytes counted against slot capacity
	fds      int   // descriptors counted against Cache.fdBudget
	leases   int
	pins     int           // requests between finding it and leasing (or describing) it
	detached bool          // no longer in Cache.entries (stale or evicted while leased)
	elem     *list.Element // in slot.lru while resident and attached
	loadDur  time.Duration
	changed  bool // loading: a change event came; the load must not publish
	// lastUse is the read-ahead clock's tick of the latest open, lease or
	// staging that used e; for a background entry nobody used yet, its
	// Background.LastUse (the read-ahead item's Heat).
	lastUse uint64
	// bg: a background load (background.go) nobody used yet, and its
	// trigger's request. Cleared by the first demand use (usedLocked),
	// which promotes a load in flight.
	bg *triggers.Background
	// yielding: staged after its readers closed it (readers.go); a new
	// reader through the mount cancels the load (yielded then says so).
	// Cleared when a lease or prefetch joins the load.
	yielding, yielded bool
	// peerBytes of the file came device to device from other replicas,
	// the rest from SOURCE. Written by the load before it publishes.
	peerBytes int64
}

// opened is a file a request opened, with what staging needs of it.
type opened struct {
	f      *os.File
	id     identity
	fid    fid    // when events
	events bool   // its filesystem's changes raise fanotify events
	why    string // why not events
}

// heldLocked says whether leases or requests hold e: it is not evicted,
// and once detached, the last of them frees it. Cache.mu must be held.
func (e *entry) heldLocked() bool { return e.leases > 0 || e.pins > 0 }

// gbps is the load throughput in GB/s (10^9 bytes per second).
func (e *entry) gbps() float64 {
	if e.loadDur <= 0 {
		return 0
	}
	return float64(e.id.size) / e.loadDur.Seconds() / 1e9
}

// Info describes an entry for .gdsfs/cache and leases.
type Info struct {
	Path     string  `json:"path"`
	Size     int64   `json:"size"`
	State    string  `json:"state"` // "failed: REASON" when failed
	LoadPath string  `json:"load_path"`
	GBps     float64 `json:"load_gbps"`
	Leases   int     `json:"leases"`
	Device   string  `json:"device"`
	Note     string  `json:"note,omitempty"` // why cuFile was not used
}

// infoLocked describes e; Cache.mu must be held.
func (e *entry) infoLocked() Info {
	state := e.state.String()
	note := e.reason
	if e.state == stFailed {
		state, note = StateFailed+": "+e.reason, ""
	}
	return Info{
		Path: e.rel, Size: e.id.size, State: state, LoadPath: e.path,
		GBps: e.gbps(), Leases: e.leases, Device: e.slot.dev.Name(), Note: note,
	}
}

// Entries describes every attached entry (one per replica), sorted by
// path, then in staging.gpus order.
func (c *Cache) Entries() []Info {
	c.lock()
	out := make([]Info, 0, len(c.entries))
	for _, cs := range c.entries {
		for _, e := range cs {
			if e != nil {
				out = append(out, e.infoLocked())
			}
		}
	}
	c.unlock()
	sort.SliceStable(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out
}
