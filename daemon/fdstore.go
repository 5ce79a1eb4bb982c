package daemon

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/daemon/handover"
	"github.com/gdsfs/gdsfs/staging"
)

// Under systemd with a file descriptor store (FileDescriptorStoreMax= in
// the unit, $FDSTORE in the environment), the daemon keeps there what a
// daemon restarted after a crash needs to carry on where it stopped: the
// FUSE connection, the lease socket, every resident region's descriptors,
// and a state describing them. A SIGKILL then loses neither the mount
// nor the staged bytes: the unit's restart gets them back
// ($LISTEN_FDS, $LISTEN_FDNAMES) and adopts them as a successor adopts a
// hand-over.
//
// The state lives in two memfds written in turn, each a header (magic,
// sequence, length, SHA-256) and the JSON: a crash while one is written
// leaves the other whole. A region's descriptors are stored before a
// state names them and removed after no state names them.

const (
	storeFUSE   = "gdsfs-fuse"
	storeIPC    = "gdsfs-ipc"
	storeStateA = "gdsfs-state-a"
	storeStateB = "gdsfs-state-b"
	storeRegion = "gdsfs-r" // + N.chunk
	storeCache  = "gdsfs-cache"
	storeMagic  = "GDSFSST1"
	storeHeader = 8 + 8 + 8 + sha256.Size
)

// storedState is what the state memfds hold.
type storedState struct {
	Protocol   int    `json:"protocol"`
	Source     string `json:"source"`
	Mountpoint string `json:"mountpoint"`
	// Parts are the components' states as a hand-over sends them; their
	// descriptors are named by Names, one list per part, in order.
	Parts []handover.Part `json:"parts"`
	Names [][]string      `json:"names"`
}

// fdStore keeps the store current.
type fdStore struct {
	log    *zap.Logger
	cache  *staging.Cache
	states [2]*os.File
	seq    uint64
	fixed  handover.State // the fs and ipc parts (they do not change)
	fixedN [][]string
	// regions names each stored entry's chunks, by entry key.
	regions map[string][]string
	next    int
	left    int // resident entries the store has no room for, at the last update
	kick    chan struct{}
	done    chan struct{}
	halted  sync.Once
	stopped sync.WaitGroup
	source  string
	mnt     string
}

// fdStoreEnabled says whether the service manager keeps descriptors for
// this daemon.
func fdStoreEnabled() bool {
	return os.Getenv("NOTIFY_SOCKET") != "" && fdStoreMax() > 0
}

// fdStoreMax is how many descriptors the store takes ($FDSTORE, as
// FileDescriptorStoreMax=; the manager closes those past it); 0: none.
func fdStoreMax() int {
	n, err := strconv.Atoi(os.Getenv("FDSTORE"))
	if err != nil || n < 0 {
		return 0
	}
	return n
}

func entryKey(e staging.EntryState) string {
	return fmt.Sprintf("%s\x00%s\x00%d", e.Path, e.Device, e.Generation)
}

// storePut stores files under name in the service manager's store.
func storePut(name string, files ...*os.File) error {
	return sdNotifyFiles("FDSTORE=1\nFDNAME="+name, files)
}

// storeRemove drops every descriptor stored under name.
func storeRemove(name string) error {
	return sdNotify("FDSTOREREMOVE=1\nFDNAME=" + name)
}

// startFDStore stores the fixed parts (FUSE connection, lease socket)
// and keeps the regions and the state current until stop.
func (d *daemon) startFDStore() error {
	if !fdStoreEnabled() {
		return nil
	}
	fsst, fsf, err := d.fs.ConnectionState()
	if err != nil {
		return fmt.Errorf("descriptor store: %w", err)
	}
	defer handover.CloseFiles(fsf)
	is, isf, err := d.ipc.CrashState()
	if err != nil {
		return fmt.Errorf("descriptor store: %w", err)
	}
	defer handover.CloseFiles(isf)
	s := &fdStore{log: d.log.Named("fdstore"), cache: d.cache, regions: map[string][]string{},
		kick: make(chan struct{}, 1), done: make(chan struct{}), source: d.source, mnt: d.absMnt}
	for _, part := range []struct {
		name, prefix string
		st           any
		files        []*os.File
	}{{partFS, storeFUSE, fsst, fsf}, {partIPC, storeIPC, is, isf}} {
		p, err := encodePart(part.name, part.st, part.files)
		if err != nil {
			return err
		}
		var names []string
		for j, f := range part.files {
			name := fmt.Sprintf("%s.%d", part.prefix, j)
			if err := storePut(name, f); err != nil {
				return fmt.Errorf("descriptor store: %w", err)
			}
			names = append(names, name)
		}
		s.fixed.Parts = append(s.fixed.Parts, p)
		s.fixedN = append(s.fixedN, names)
	}
	for i := range s.states {
		fd, err := unix.MemfdCreate("gdsfs-state", unix.MFD_CLOEXEC)
		if err != nil {
			return fmt.Errorf("descriptor store: memfd_create: %w", err)
		}
		s.states[i] = os.NewFile(uintptr(fd), "gdsfs-state")
		if err := storePut([]string{storeStateA, storeStateB}[i], s.states[i]); err != nil {
			return fmt.Errorf("descriptor store: %w", err)
		}
	}
	d.store = s
	stopEvents := d.cache.Subscribe(func(e staging.Event) {
		if e.State == "resident" || e.State == "absent" {
			s.changed()
		}
	})
	s.stopped.Add(1)
	go func() {
		defer s.stopped.Done()
		defer stopEvents()
		for {
			select {
			case <-s.kick:
				if err := s.update(); err != nil {
					s.log.Warn("descriptor store not updated: a crash now loses what changed since", zap.Error(err))
				}
			case <-s.done:
				return
			}
		}
	}()
	s.changed()
	return nil
}

func (s *fdStore) changed() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// update stores the regions staged since, writes the state, then drops
// the regions no longer resident.
func (s *fdStore) update() error {
	cs, files, err := s.cache.Snapshot()
	if err != nil {
		return err
	}
	defer handover.CloseFiles(files)
	keep := map[string]bool{}
	var names []string
	// The manager closes a descriptor stored past $FDSTORE: an entry
	// whose chunks do not fit beside what the store holds is left out
	// of it (a crash then drops it), not named by a state that a
	// restart would refuse whole.
	held := len(s.names())
	entries := cs.Entries[:0:0]
	var left int
	for _, e := range cs.Entries {
		k := entryKey(e)
		got, ok := s.regions[k]
		if !ok {
			if held+len(e.Files) > fdStoreMax() {
				left++
				continue
			}
			for j, fi := range e.Files {
				name := fmt.Sprintf("%s%d.%d", storeRegion, s.next, j)
				if err := storePut(name, files[fi]); err != nil {
					return err
				}
				got = append(got, name)
			}
			held += len(got)
			s.next++
			s.regions[k] = got
		}
		keep[k] = true
		// The state names the chunks by their place among the cache
		// part's names, as a hand-over names them among its files.
		e.Files = make([]int, len(got))
		for j := range got {
			e.Files[j] = len(names) + j
		}
		names = append(names, got...)
		entries = append(entries, e)
	}
	cs.Entries = entries
	if left != s.left {
		if left > 0 {
			s.log.Warn("descriptor store full ($FDSTORE, FileDescriptorStoreMax=): resident files left out of it are dropped by a crash",
				zap.Int("left_out", left), zap.Int("store_max", fdStoreMax()))
		}
		s.left = left
	}
	p, err := encodePart(partCache, cs, make([]*os.File, len(names)))
	if err != nil {
		return err
	}
	st := storedState{Protocol: handover.Protocol, Source: s.source, Mountpoint: s.mnt,
		Parts: append(append([]handover.Part{}, s.fixed.Parts...), p),
		Names: append(append([][]string{}, s.fixedN...), names)}
	if err := s.write(st); err != nil {
		return err
	}
	var total int64
	for _, e := range cs.Entries {
		total += e.Size
	}
	if err := sdNotify(fmt.Sprintf("STATUS=serving %s; %d files (%d bytes) resident, kept for a restart", s.mnt, len(cs.Entries), total)); err != nil {
		return err
	}
	for k, ns := range s.regions {
		if keep[k] {
			continue
		}
		for _, n := range ns {
			if err := storeRemove(n); err != nil {
				return err
			}
		}
		delete(s.regions, k)
	}
	return nil
}

// write writes st to the state memfd not written last.
func (s *fdStore) write(st storedState) error {
	body, err := json.Marshal(st)
	if err != nil {
		return err
	}
	s.seq++
	f := s.states[s.seq%2]
	var h bytes.Buffer
	h.WriteString(storeMagic)
	binary.Write(&h, binary.LittleEndian, s.seq)
	binary.Write(&h, binary.LittleEndian, uint64(len(body)))
	sum := sha256.Sum256(body)
	h.Write(sum[:])
	if err := f.Truncate(0); err != nil {
		return err
	}
	if _, err := f.WriteAt(append(h.Bytes(), body...), 0); err != nil {
		return err
	}
	return nil
}

// halt ends the updates (once).
func (s *fdStore) halt() {
	s.halted.Do(func() {
		close(s.done)
		s.stopped.Wait()
	})
}

// names are the names this daemon stored.
func (s *fdStore) names() []string {
	names := []string{storeStateA, storeStateB}
	for _, ns := range s.fixedN {
		names = append(names, ns...)
	}
	for _, ns := range s.regions {
		names = append(names, ns...)
	}
	return names
}

// stop ends the updates; clear also empties the store (a clean stop: the
// next start mounts afresh). Nil: no store, nothing to do.
func (s *fdStore) stop(clear bool) {
	if s == nil {
		return
	}
	s.halt()
	if !clear {
		return
	}
	for _, n := range s.names() {
		if err := storeRemove(n); err != nil {
			s.log.Warn("descriptor store not cleared", zap.String("name", n), zap.Error(err))
		}
	}
	for _, f := range s.states {
		f.Close()
	}
}

// keep replaces what the store holds with a hand-over's state and
// descriptors (handoff's, taken with FUSE and the lease server paused),
// for the unit's restart to adopt as a successor adopts a hand-over.
// More descriptors than the store takes are refused before anything
// changes. Otherwise the updates end, and no state in the store is whole
// until the last write: a keep cut short (a crash, a descriptor the
// manager refused) leaves none for the next start to adopt with what it
// half replaced. On error the caller empties the store (stop(true)
// removes every name keep stored).
func (s *fdStore) keep(st handover.State, files []*os.File) error {
	if most := fdStoreMax(); len(s.states)+len(files) > most {
		return fmt.Errorf("descriptor store: the restart needs %d descriptors, the store takes %d ($FDSTORE, FileDescriptorStoreMax=)", len(s.states)+len(files), most)
	}
	s.halt()
	for _, f := range s.states {
		if err := f.Truncate(0); err != nil {
			return fmt.Errorf("descriptor store: %w", err)
		}
	}
	for _, n := range s.names()[2:] { // the state memfds stay: write replaces their content
		if err := storeRemove(n); err != nil {
			return err
		}
	}
	// fixedN names each part's descriptors, as the state does.
	s.fixedN, s.regions = nil, map[string][]string{}
	prefix := map[string]string{partFS: storeFUSE, partIPC: storeIPC, partCache: storeCache}
	next := 0
	for i, p := range st.Parts {
		if prefix[p.Name] == "" || next+p.Files > len(files) {
			return fmt.Errorf("descriptor store: cannot keep hand-over part %q with %d descriptors", p.Name, p.Files)
		}
		s.fixedN = append(s.fixedN, nil)
		for j := range p.Files {
			name := fmt.Sprintf("%s.%d", prefix[p.Name], j)
			// Named before it is sent: stop(true) removes it however
			// far the keep got.
			s.fixedN[i] = append(s.fixedN[i], name)
			if err := storePut(name, files[next+j]); err != nil {
				return fmt.Errorf("descriptor store: %w", err)
			}
		}
		next += p.Files
	}
	if err := s.write(storedState{Protocol: handover.Protocol, Source: s.source, Mountpoint: s.mnt,
		Parts: st.Parts, Names: s.fixedN}); err != nil {
		return fmt.Errorf("descriptor store: %w", err)
	}
	// Every descriptor is in the manager's hands before this daemon
	// lets go of its own.
	return sdBarrier()
}

// readState reads the newer whole state of the two memfds.
func readState(files []*os.File) (storedState, error) {
	var best storedState
	var bestSeq uint64
	var errs []error
	for _, f := range files {
		var b []byte
		fi, err := f.Stat()
		if err == nil && fi.Size() > storeHeader+handover.MaxMessage {
			err = fmt.Errorf("a state of %d bytes, more than the %d a hand-over takes", fi.Size(), storeHeader+handover.MaxMessage)
		}
		if err == nil {
			b, err = io.ReadAll(io.NewSectionReader(f, 0, storeHeader+handover.MaxMessage))
		}
		if err == nil && (len(b) < storeHeader || string(b[:8]) != storeMagic) {
			err = errors.New("no state header")
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		seq := binary.LittleEndian.Uint64(b[8:16])
		n := binary.LittleEndian.Uint64(b[16:24])
		body := b[storeHeader:]
		if uint64(len(body)) != n || sha256.Sum256(body) != [sha256.Size]byte(b[24:storeHeader]) {
			errs = append(errs, errors.New("a state cut short (written when the daemon died)"))
			continue
		}
		var st storedState
		if err := json.Unmarshal(body, &st); err != nil {
			errs = append(errs, err)
			continue
		}
		if seq > bestSeq {
			best, bestSeq = st, seq
		}
	}
	if bestSeq == 0 {
		return best, fmt.Errorf("no whole state in the descriptor store: %w", errors.Join(errs...))
	}
	return best, nil
}

// listenFiles are the descriptors the service manager passed
// ($LISTEN_PID, $LISTEN_FDS, $LISTEN_FDNAMES: sd_listen_fds(3)), by
// name. It unsets the variables so no child inherits them.
func listenFiles() (map[string]*os.File, error) {
	defer func() {
		os.Unsetenv("LISTEN_PID")
		os.Unsetenv("LISTEN_FDS")
		os.Unsetenv("LISTEN_FDNAMES")
	}()
	if pid, err := strconv.Atoi(os.Getenv("LISTEN_PID")); err != nil || pid != os.Getpid() {
		return nil, nil
	}
	n, err := strconv.Atoi(os.Getenv("LISTEN_FDS"))
	if err != nil || n <= 0 {
		return nil, nil
	}
	fds := make([]int, n)
	for i := range fds {
		fds[i] = 3 + i
		unix.CloseOnExec(fds[i])
	}
	return namedFiles(fds, strings.Split(os.Getenv("LISTEN_FDNAMES"), ":"))
}

// namedFiles names each of fds by names, in order ("unknown" past the
// end). A name given twice is an error naming it; the map then holds its
// first descriptor and the later ones are closed.
func namedFiles(fds []int, names []string) (map[string]*os.File, error) {
	out := map[string]*os.File{}
	var twice []string
	for i, fd := range fds {
		name := "unknown"
		if i < len(names) {
			name = names[i]
		}
		if _, ok := out[name]; ok {
			unix.Close(fd)
			if !slices.Contains(twice, name) {
				twice = append(twice, name)
			}
			continue
		}
		out[name] = os.NewFile(uintptr(fd), name)
	}
	if len(twice) > 0 {
		return out, fmt.Errorf("descriptor store: %s passed more than once", strings.Join(twice, ", "))
	}
	return out, nil
}

// fromStore builds a hand-over's state and files from what the store
// passed back; the files not named by the state are closed.
func fromStore(passed map[string]*os.File) (storedState, handover.State, map[string][]*os.File, error) {
	var stateFiles []*os.File
	for _, n := range []string{storeStateA, storeStateB} {
		if f := passed[n]; f != nil {
			stateFiles = append(stateFiles, f)
		}
	}
	st, err := readState(stateFiles)
	if err == nil && st.Protocol != handover.Protocol {
		err = fmt.Errorf("descriptor store: its state is of hand-over protocol %d, this daemon speaks %d", st.Protocol, handover.Protocol)
	}
	if err != nil {
		return st, handover.State{}, nil, err
	}
	files := map[string][]*os.File{}
	used := map[string]bool{storeStateA: true, storeStateB: true}
	for i, p := range st.Parts {
		if i >= len(st.Names) {
			return st, handover.State{}, nil, fmt.Errorf("descriptor store: part %s has no names", p.Name)
		}
		if _, ok := files[p.Name]; ok {
			return st, handover.State{}, nil, fmt.Errorf("descriptor store: part %s stored twice", p.Name)
		}
		files[p.Name] = nil
		for _, n := range st.Names[i] {
			f := passed[n]
			if f == nil {
				return st, handover.State{}, nil, fmt.Errorf("descriptor store: %s is missing", n)
			}
			files[p.Name] = append(files[p.Name], f)
			used[n] = true
		}
	}
	for n, f := range passed {
		if !used[n] {
			f.Close()
		}
	}
	return st, handover.State{Parts: st.Parts}, files, nil
}
