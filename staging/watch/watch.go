package watch

import (
	"encoding/binary"
	"fmt"
	"os"
	"sync"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// Modes (staging.watch).
const (
	// Auto: fanotify events on every local filesystem SOURCE's files
	// live on, the racy-timestamp rule elsewhere.
	Auto = "auto"
	// Timestamps: the racy-timestamp rule everywhere.
	Timestamps = "timestamps"
)

// FID names a file the way fanotify reports it: the filesystem id and the
// file handle (FAN_REPORT_FID). Two descriptors of one inode have one FID.
type FID string

// Handle is the file handle part of a FID (for open_by_handle_at), or
// false when the FID is malformed.
func (f FID) Handle() (unix.FileHandle, bool) {
	if len(f) < 16 {
		return unix.FileHandle{}, false
	}
	n := int(binary.NativeEndian.Uint32([]byte(f[8:12])))
	if 16+n > len(f) {
		return unix.FileHandle{}, false
	}
	return unix.NewFileHandle(int32(binary.NativeEndian.Uint32([]byte(f[12:16]))), []byte(f[16:16+n])), true
}

// Change is one event for the entries subscriber.
type Change struct {
	Mask uint64 // unix.FAN_* bits (FAN_ONDIR when about a directory)
	Dir  FID    // the directory holding Name; empty when not reported
	Name string // the entry of Dir the event is about; "." is Dir itself
	Self FID    // the file or directory itself; empty when not reported
}

// Subscriber is told of changes. Its functions run with the reading lock
// held, in event order, and must not block.
type Subscriber struct {
	Modified func(FID)    // a file's bytes changed (FAN_MODIFY, FAN_CLOSE_WRITE)
	Entries  func(Change) // anything else: entries and attributes
	Lost     func()       // events were lost (queue overflow): trust nothing
	// Mounts: a filesystem was mounted on mountpoint or unmounted from
	// it (a path as this process sees it), in this process's mount
	// namespace.
	Mounts func(mountpoint string)
}

// Events a mark asks for. Entry events are reported only when the group
// names the directory and entry (FAN_REPORT_DFID_NAME, Linux 5.9).
const (
	modifyMask = unix.FAN_MODIFY | unix.FAN_CLOSE_WRITE
	entryMask  = unix.FAN_ATTRIB | unix.FAN_CREATE | unix.FAN_DELETE | unix.FAN_MOVED_FROM |
		unix.FAN_MOVED_TO | unix.FAN_DELETE_SELF | unix.FAN_MOVE_SELF | unix.FAN_ONDIR
)

// Watcher reads fanotify events for the filesystems SOURCE's files live
// on and reports them to its subscribers.
//
// A write's event is queued before the write returns to its caller, so a
// Drain at the start of a request sees every write that completed before
// the request.
type Watcher struct {
	log *zap.Logger

	fd      int         // the fanotify group; -1 when there is none
	why     string      // why there is none
	entries bool        // the group reports entry events (FAN_REPORT_DFID_NAME)
	wake    int         // eventfd that stops the reader; -1 with no group
	mounts  *mountTable // nil when mount changes are not followed
	noMount string      // why they are not

	// Lock order: drainMu, then subMu or mu.
	drainMu sync.Mutex // serializes reads of fd and their handling
	buf     []byte     // guarded by drainMu
	stopped bool       // guarded by drainMu; fd closed

	subMu sync.Mutex
	subs  []Subscriber // guarded by subMu

	mu  sync.Mutex
	fss map[uint64]*fsWatch // by st_dev; guarded by mu
	wg  sync.WaitGroup      // the reader
}

// fsWatch is what is known of one filesystem.
type fsWatch struct {
	events bool   // marked: its modifications are reported
	why    string // why not
	fsid   [8]byte
}

// New starts watching in mode (Auto or Timestamps). Filesystems are
// marked as Probe meets them.
func New(mode string, log *zap.Logger) *Watcher {
	if log == nil {
		log = zap.NewNop()
	}
	w := &Watcher{log: log, fd: -1, wake: -1, fss: map[uint64]*fsWatch{}, buf: make([]byte, 64<<10)}
	if mode == Timestamps {
		w.why = "staging.watch is timestamps"
		return w
	}
	const flags = unix.FAN_CLASS_NOTIF | unix.FAN_CLOEXEC | unix.FAN_NONBLOCK | unix.FAN_UNLIMITED_QUEUE
	fd, err := unix.FanotifyInit(flags|unix.FAN_REPORT_FID|unix.FAN_REPORT_DFID_NAME, unix.O_RDONLY|unix.O_LARGEFILE)
	w.entries = err == nil
	if err != nil {
		fd, err = unix.FanotifyInit(flags|unix.FAN_REPORT_FID, unix.O_RDONLY|unix.O_LARGEFILE)
	}
	if err != nil {
		w.why = fmt.Sprintf("fanotify_init: %v (fanotify needs CAP_SYS_ADMIN and Linux 5.1)", err)
		return w
	}
	wake, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		unix.Close(fd)
		w.why = fmt.Sprintf("eventfd: %v", err)
		return w
	}
	w.fd, w.wake = fd, wake
	if w.mounts, err = openMounts(); err != nil {
		w.noMount = err.Error()
		log.Warn("mounts and unmounts in SOURCE are not followed", zap.Error(err))
	}
	w.wg.Add(1)
	go w.read()
	return w
}

// Subscribe adds s; it hears of events read from then on.
func (w *Watcher) Subscribe(s Subscriber) {
	w.subMu.Lock()
	w.subs = append(w.subs, s)
	w.subMu.Unlock()
}

// Probe makes sure f's filesystem is watched if it can be, and returns
// f's FID when it is (events true) or why it is not.
func (w *Watcher) Probe(f *os.File, dev uint64) (id FID, events bool, why string) {
	w.mu.Lock()
	fs := w.fss[dev]
	if fs == nil {
		fs = w.mark(f)
		w.fss[dev] = fs
		w.log.Info("change detection", zap.Uint64("dev", dev), zap.Bool("fanotify", fs.events),
			zap.Bool("entries", fs.events && w.entries), zap.String("why_not", fs.why))
	}
	w.mu.Unlock()
	if !fs.events {
		return "", false, fs.why
	}
	id, err := FileFID(int(f.Fd()), fs.fsid)
	if err != nil {
		return "", false, err.Error()
	}
	return id, true, ""
}

// ProbeEntries is Probe for a subscriber of entry events: events is
// false, with why, when f's filesystem raises none or the kernel cannot
// name entries (Linux < 5.9).
func (w *Watcher) ProbeEntries(f *os.File, dev uint64) (events bool, why string) {
	_, events, why = w.Probe(f, dev)
	if events && !w.entries {
		return false, "fanotify cannot name directory entries (FAN_REPORT_DFID_NAME needs Linux 5.9)"
	}
	if events && w.mounts == nil {
		return false, "mounts are not followed: " + w.noMount
	}
	return events, why
}

// mark watches f's filesystem. w.mu must be held.
func (w *Watcher) mark(f *os.File) *fsWatch {
	if w.fd < 0 {
		return &fsWatch{why: w.why}
	}
	var sfs unix.Statfs_t
	if err := unix.Fstatfs(int(f.Fd()), &sfs); err != nil {
		return &fsWatch{why: fmt.Sprintf("fstatfs: %v", err)}
	}
	if _, ok := localFS[int64(sfs.Type)]; !ok {
		name := otherFS[int64(sfs.Type)]
		if name == "" {
			name = fmt.Sprintf("type 0x%x", sfs.Type)
		}
		return &fsWatch{why: "a " + name + " filesystem: changes made elsewhere raise no local event"}
	}
	mask := uint64(modifyMask)
	if w.entries {
		mask |= entryMask
	}
	err := unix.FanotifyMark(w.fd, unix.FAN_MARK_ADD|unix.FAN_MARK_FILESYSTEM, mask, int(f.Fd()), "")
	if err != nil {
		return &fsWatch{why: fmt.Sprintf("fanotify_mark: %v", err)}
	}
	return &fsWatch{events: true, fsid: fsidOf(&sfs)}
}

// Mode describes change detection on dev for stats: "fanotify" or
// "timestamps: WHY".
func (w *Watcher) Mode(dev uint64) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	fs := w.fss[dev]
	switch {
	case fs == nil && w.fd < 0:
		return "timestamps: " + w.why
	case fs == nil:
		return "fanotify (not yet marked)"
	case fs.events:
		return "fanotify"
	}
	return "timestamps: " + fs.why
}

// Close stops the reader and closes the group.
func (w *Watcher) Close() {
	if w.fd < 0 {
		return
	}
	var one [8]byte
	binary.NativeEndian.PutUint64(one[:], 1)
	unix.Write(w.wake, one[:])
	w.wg.Wait()
	w.drainMu.Lock()
	w.stopped = true
	unix.Close(w.fd)
	if w.mounts != nil {
		w.mounts.close()
	}
	unix.Close(w.wake)
	w.drainMu.Unlock()
}
