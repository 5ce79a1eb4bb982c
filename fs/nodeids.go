package fs

import "sync"

// The kernel names a node by the node id the daemon gave it, for as long
// as it holds the node, across a hand-over to a successor daemon too
// (handover.go). So a node id is a function of the backing inode alone,
// never a counter of one daemon's: a file of SOURCE's filesystem has its
// inode number as node id; a file of another filesystem mounted beneath
// SOURCE, or one whose number would clash with the reserved ranges, gets a
// number from a table, kept for the daemon's life and handed over with
// the mount.

// foreignBase is the first node id the table hands out; SOURCE's inode
// numbers at or above it go to the table too. The control files sit far
// above (controlIno).
const foreignBase = 0xc000_0000_0000_0000

// devIno is a backing inode without its generation: a reused inode
// number keeps its node id (go-fuse tells incarnations apart by the
// generation).
type devIno struct{ Dev, Ino uint64 }

// nodeIDs maps backing inodes to node ids.
type nodeIDs struct {
	srcDev uint64 // SOURCE's device; fixed

	mu      sync.Mutex
	foreign map[devIno]uint64 // guarded by mu
	next    uint64            // the last id handed out is foreignBase+next; guarded by mu
}

// own reports whether the inode ino of device dev is its own node id
// (SOURCE's filesystem, outside the reserved ranges).
func (t *nodeIDs) own(dev, ino uint64) bool {
	return dev == t.srcDev && ino > 1 && ino < foreignBase
}

// of is the node id of the inode ino of device dev.
func (t *nodeIDs) of(dev, ino uint64) uint64 {
	if t.own(dev, ino) {
		return ino
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if id, ok := t.foreign[devIno{dev, ino}]; ok {
		return id
	}
	if t.foreign == nil {
		t.foreign = map[devIno]uint64{}
	}
	t.next++
	id := foreignBase + t.next
	t.foreign[devIno{dev, ino}] = id
	return id
}

// known is of for an inode that has a node id already: false for one
// the table has not numbered (none is handed out here).
func (t *nodeIDs) known(dev, ino uint64) (uint64, bool) {
	if t.own(dev, ino) {
		return ino, true
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	id, ok := t.foreign[devIno{dev, ino}]
	return id, ok
}

// foreignID is one entry of the table, as handed over.
type foreignID struct {
	Dev, Ino, ID uint64
}

// snapshot returns the table.
func (t *nodeIDs) snapshot() (ids []foreignID, next uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for k, id := range t.foreign {
		ids = append(ids, foreignID{Dev: k.Dev, Ino: k.Ino, ID: id})
	}
	return ids, t.next
}

// restore takes over a predecessor's table (before serving).
func (t *nodeIDs) restore(ids []foreignID, next uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.foreign = map[devIno]uint64{}
	for _, e := range ids {
		t.foreign[devIno{e.Dev, e.Ino}] = e.ID
	}
	t.next = next
}
