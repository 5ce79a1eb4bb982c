package fs

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"unsafe"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/staging/watch"
)

// A daemon that dies (SIGKILL, a panic) takes its node table with it,
// while the kernel goes on naming the nodes it holds by their ids: a
// successor that adopts the connection from the service manager's
// descriptor store (ConnectionState) would answer ESTALE for each, and
// a request the kernel does not retry (fstat of a file opened before the
// crash) fails. The journal is a memfd the descriptor store keeps beside
// the connection, mapped shared, in which the daemon mirrors the nodes
// the kernel may cache for long (metaCache.nodes): a slot per node, its
// id and the file handle change events name it by, and the highest file
// handle number handed to the kernel. Memory
// outlives the process, so a slot is whole or free whatever instant the
// daemon died in: a slot's id is stored last when it is filled and first
// when it is freed. The successor opens each handle, finds the file's
// path beneath SOURCE and adopts the node there (journalNodes); a node
// whose file is gone, moved out of SOURCE or not openable by handle stays
// unknown (ESTALE, as before).
//
// Kept only where change detection reports SOURCE's changes (the nodes
// have handles then) and the daemon has a store (Config.Journal).

const (
	journalMagic = "GDSFSNJ1"
	journalSlot  = 192     // bytes per slot: id 8, unused 4, handle length 4, handle (a FID: 16 + MAX_HANDLE_SZ 128); slot 0 is the header: magic 8, slot size 4, slots 4, slots handed out 8, highest file handle number handed out 8
	journalSlots = 1 << 20 // at most that many nodes are journaled; the memfd is sparse
	journalFID   = journalSlot - 16
)

// nodeJournal is the writer's side; every method runs under
// metaCache.nodesMu.
type nodeJournal struct {
	f    *os.File
	mem  []byte
	slot map[*gofs.Inode]int // each journaled node's slot
	free []int               // slots freed for reuse
	next int                 // slots handed out so far (slot 0 is the header)
	full bool                // a node found no slot (logged once)
	fh   uint64              // the highest file handle number handed to the kernel
}

// maxDeadHandles bounds the handle numbers a successor holds back.
const maxDeadHandles = 1 << 20

// noteHandle records fh as handed to the kernel: a successor after a
// crash holds the numbers up to the highest back (adoptHandles), since
// the kernel may still name them.
func (j *nodeJournal) noteHandle(fh uint64) {
	if fh > j.fh {
		j.fh = fh
		atomic.StoreUint64(j.word(24), fh)
	}
}

// newJournal makes an empty journal.
func newJournal() (*nodeJournal, error) {
	fd, err := unix.MemfdCreate("gdsfs-nodes", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("node journal: memfd_create: %w", err)
	}
	f := os.NewFile(uintptr(fd), "gdsfs-nodes")
	size := journalSlot * (journalSlots + 1)
	if err := f.Truncate(int64(size)); err != nil {
		f.Close()
		return nil, fmt.Errorf("node journal: %w", err)
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("node journal: mmap: %w", err)
	}
	copy(mem, journalMagic)
	binary.LittleEndian.PutUint32(mem[8:], journalSlot)
	binary.LittleEndian.PutUint32(mem[12:], journalSlots)
	return &nodeJournal{f: f, mem: mem, slot: map[*gofs.Inode]int{}, next: 1}, nil
}

// word is the 8-byte word at offset off of the mapping, stored
// atomically: the header's counts and each slot's id.
func (j *nodeJournal) word(off int) *uint64 {
	return (*uint64)(unsafe.Pointer(&j.mem[off]))
}

// add journals n, the node of the file events name fid; false when no
// slot is left.
func (j *nodeJournal) add(n *gofs.Inode, fid watch.FID) bool {
	if _, ok := j.slot[n]; ok || len(fid) > journalFID {
		return true
	}
	var i int
	switch {
	case len(j.free) > 0:
		i, j.free = j.free[len(j.free)-1], j.free[:len(j.free)-1]
	case j.next <= journalSlots:
		i = j.next
		j.next++
		// The reader looks no further than the slots handed out.
		atomic.StoreUint64(j.word(16), uint64(j.next))
	default:
		return false
	}
	b := j.mem[i*journalSlot : (i+1)*journalSlot]
	binary.LittleEndian.PutUint32(b[12:], uint32(len(fid)))
	copy(b[16:], fid)
	atomic.StoreUint64(j.word(i*journalSlot), n.StableAttr().Ino) // last: the slot is whole from here
	j.slot[n] = i
	return true
}

// drop frees n's slot.
func (j *nodeJournal) drop(n *gofs.Inode) {
	i, ok := j.slot[n]
	if !ok {
		return
	}
	atomic.StoreUint64(j.word(i*journalSlot), 0) // first: the slot is free from here
	delete(j.slot, n)
	j.free = append(j.free, i)
}

func (j *nodeJournal) close() {
	unix.Munmap(j.mem)
	j.f.Close()
}

// journalRecord is one node a dead daemon's journal names.
type journalRecord struct {
	id  uint64
	fid watch.FID
}

// readJournal reads the nodes journaled in f and the highest handle
// number its daemon handed out.
func readJournal(f *os.File) ([]journalRecord, uint64, error) {
	fi, err := f.Stat()
	if err != nil {
		return nil, 0, fmt.Errorf("node journal: %w", err)
	}
	if fi.Size() != journalSlot*(journalSlots+1) {
		return nil, 0, fmt.Errorf("node journal: %d bytes, not a journal's %d", fi.Size(), journalSlot*(journalSlots+1))
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, int(fi.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, 0, fmt.Errorf("node journal: mmap: %w", err)
	}
	defer unix.Munmap(mem)
	if string(mem[:8]) != journalMagic || binary.LittleEndian.Uint32(mem[8:]) != journalSlot ||
		binary.LittleEndian.Uint32(mem[12:]) != journalSlots {
		return nil, 0, errors.New("node journal: no journal header")
	}
	used := min(binary.LittleEndian.Uint64(mem[16:]), journalSlots+1)
	var recs []journalRecord
	for i := 1; i < int(used); i++ {
		b := mem[i*journalSlot : (i+1)*journalSlot]
		id := binary.LittleEndian.Uint64(b)
		n := binary.LittleEndian.Uint32(b[12:])
		if id <= 1 || n > journalFID {
			continue
		}
		recs = append(recs, journalRecord{id: id, fid: watch.FID(b[16 : 16+n])})
	}
	return recs, binary.LittleEndian.Uint64(mem[24:]), nil
}

// journalNodes are the nodes of recs, found again beneath SOURCE, with
// the directories on the way to them, as a hand-over names nodes
// (parents first, one kernel reference each: the count died with the
// daemon, and a FORGET never takes more than was given). A record whose
// file is not found at a path beneath SOURCE with the same node id is
// left out; lost are their ids.
func (s *Server) journalNodes(recs []journalRecord) (nodes []NodeState, lost []uint64) {
	m := &s.meta
	if len(recs) == 0 {
		return nil, nil
	}
	index := map[uint64]int{} // node id -> place in nodes
	seen := map[uint64]bool{}
	for _, r := range recs {
		if seen[r.id] {
			continue
		}
		seen[r.id] = true
		rel, ok := "", m.on
		if ok {
			rel, ok = s.journalPath(r)
		}
		if !ok || !s.journalChain(rel, r.id, r.fid, &nodes, index) {
			lost = append(lost, r.id)
		}
	}
	s.log.Info("node journal: the nodes the kernel held, found again", zap.Int("found", len(seen)-len(lost)), zap.Int("lost", len(lost)))
	return nodes, lost
}

// journalPath is the path beneath SOURCE of r's file.
func (s *Server) journalPath(r journalRecord) (string, bool) {
	h, ok := r.fid.Handle()
	if !ok || r.fid[:8] != watch.FID(s.meta.fsid[:]) {
		return "", false
	}
	fd, err := unix.OpenByHandleAt(int(s.meta.source.Fd()), h, unix.O_PATH|unix.O_CLOEXEC)
	if err != nil {
		return "", false
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil || s.ids.of(st.Dev, st.Ino) != r.id {
		return "", false
	}
	p, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", fd))
	if err != nil || strings.HasSuffix(p, " (deleted)") {
		return "", false
	}
	rel, err := filepath.Rel(s.source, p)
	if err != nil || rel == "." || rel == ".." || strings.HasPrefix(rel, "../") {
		return "", false
	}
	return rel, true
}

// journalChain adds the nodes from SOURCE down to rel, whose last must
// have node id id and be the file fid names, to nodes (index: where each id is in it); false when
// the path does not lead there now.
func (s *Server) journalChain(rel string, id uint64, fid watch.FID, nodes *[]NodeState, index map[uint64]int) bool {
	var chain []NodeState
	parent := uint64(1)
	err := s.root.At(func(rootfd int) error {
		dirfd := rootfd
		defer func() {
			if dirfd != rootfd {
				unix.Close(dirfd)
			}
		}()
		for name := range strings.SplitSeq(rel, "/") {
			fd, err := unix.Openat(dirfd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				return err
			}
			if dirfd != rootfd {
				unix.Close(dirfd)
			}
			dirfd = fd
			st, fileID, err := fstatx(fd)
			if err != nil {
				return err
			}
			nid := s.ids.of(fileID.dev, fileID.ino)
			chain = append(chain, NodeState{ID: nid, Parent: parent, Name: name, Mode: st.Mode,
				Dev: fileID.dev, Ino: fileID.ino, Gen: fileID.gen, FID: string(s.meta.fid(fd, fileID)), Kept: -1})
			parent = nid
		}
		return nil
	})
	// The same file: a file made at the path since with the inode number
	// of the journaled one has the id but another handle.
	if err != nil || len(chain) == 0 || chain[len(chain)-1].ID != id || chain[len(chain)-1].FID != string(fid) {
		return false
	}
	chain[len(chain)-1].Lookups = 1
	for _, ns := range chain {
		if i, ok := index[ns.ID]; ok {
			if ns.Lookups > 0 {
				(*nodes)[i].Lookups = 1
			}
			continue
		}
		index[ns.ID] = len(*nodes)
		*nodes = append(*nodes, ns)
	}
	return true
}
