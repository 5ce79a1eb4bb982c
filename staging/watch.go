package staging

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// Change detection (staging.watch).
const (
	// WatchAuto: fanotify events on every local filesystem SOURCE's files
	// live on, the racy-timestamp rule elsewhere.
	WatchAuto = "auto"
	// WatchTimestamps: the racy-timestamp rule everywhere.
	WatchTimestamps = "timestamps"
)

// fid names a file the way fanotify reports it: the filesystem id and the
// file handle (FAN_REPORT_FID). Two descriptors of one inode have one fid.
type fid string

// watcher reads fanotify events for the filesystems SOURCE's files live on
// (one FAN_MARK_FILESYSTEM mark each, in FID mode: no descriptor is opened
// per event, so it costs nothing from the descriptor budget) and reports
// every file modified (FAN_MODIFY: write, truncate, fallocate, copy; and
// FAN_CLOSE_WRITE: the last close of a file opened for writing, which also
// covers stores through a shared mapping once the writer lets go).
//
// A write's event is queued before the write returns to its caller, so a
// drain at the start of a request sees every write that completed before
// the request.
type watcher struct {
	log      *zap.Logger
	onChange func(fid) // called with drainMu held, for each modified file
	onLost   func()    // events were lost (queue overflow): trust nothing

	fd   int    // the fanotify group; -1 when there is none
	why  string // why there is none
	wake int    // eventfd that stops the reader; -1 with no group

	drainMu sync.Mutex // serializes reads of fd and their handling
	buf     []byte     // guarded by drainMu
	stopped bool       // guarded by drainMu; fd closed

	mu  sync.Mutex
	fss map[uint64]*fsWatch // by st_dev
	wg  sync.WaitGroup      // the reader
}

// fsWatch is what is known of one filesystem.
type fsWatch struct {
	events bool   // marked: its modifications are reported
	why    string // why not
	fsid   [8]byte
}

// Filesystems whose every modification passes through this kernel, so
// fanotify sees it. Network and FUSE filesystems (nfs, lustre, cifs,
// ceph, fuse, ...) and stacked ones (overlay: a write to a lower or upper
// directory bypasses the overlay's superblock) are not among them.
var localFS = map[int64]string{
	0xEF53: "ext4", 0x58465342: "xfs", 0x9123683E: "btrfs", 0x01021994: "tmpfs",
	0xF2F52010: "f2fs", 0xca451a4e: "bcachefs", 0x858458f6: "ramfs",
}

var otherFS = map[int64]string{
	0x6969: "nfs", 0x65735546: "fuse", 0x0BD00BD0: "lustre", 0xFF534D42: "cifs",
	0xFE534D42: "smb2", 0x00c36400: "ceph", 0x794c7630: "overlay", 0x01021997: "9p",
	0x47504653: "gpfs", 0x2fc12fc1: "zfs", 0x5346414F: "afs",
}

func newWatcher(mode string, log *zap.Logger, onChange func(fid), onLost func()) *watcher {
	w := &watcher{log: log, onChange: onChange, onLost: onLost, fd: -1, wake: -1,
		fss: map[uint64]*fsWatch{}, buf: make([]byte, 64<<10)}
	if mode == WatchTimestamps {
		w.why = "staging.watch is timestamps"
		return w
	}
	fd, err := unix.FanotifyInit(unix.FAN_CLASS_NOTIF|unix.FAN_CLOEXEC|unix.FAN_NONBLOCK|
		unix.FAN_REPORT_FID|unix.FAN_UNLIMITED_QUEUE, unix.O_RDONLY|unix.O_LARGEFILE)
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
	w.wg.Add(1)
	go w.read()
	return w
}

// probe makes sure f's filesystem is watched if it can be, and returns
// f's fid when it is (events true) or why it is not.
func (w *watcher) probe(f *os.File, dev uint64) (id fid, events bool, why string) {
	w.mu.Lock()
	fs := w.fss[dev]
	if fs == nil {
		fs = w.mark(f)
		w.fss[dev] = fs
		w.log.Info("change detection", zap.Uint64("dev", dev), zap.Bool("fanotify", fs.events), zap.String("why_not", fs.why))
	}
	w.mu.Unlock()
	if !fs.events {
		return "", false, fs.why
	}
	id, err := fileFID(f, fs.fsid)
	if err != nil {
		return "", false, err.Error()
	}
	return id, true, ""
}

// mark watches f's filesystem. w.mu must be held.
func (w *watcher) mark(f *os.File) *fsWatch {
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
	err := unix.FanotifyMark(w.fd, unix.FAN_MARK_ADD|unix.FAN_MARK_FILESYSTEM,
		unix.FAN_MODIFY|unix.FAN_CLOSE_WRITE, int(f.Fd()), "")
	if err != nil {
		return &fsWatch{why: fmt.Sprintf("fanotify_mark: %v", err)}
	}
	fs := &fsWatch{events: true}
	binary.NativeEndian.PutUint32(fs.fsid[0:], uint32(sfs.Fsid.Val[0]))
	binary.NativeEndian.PutUint32(fs.fsid[4:], uint32(sfs.Fsid.Val[1]))
	return fs
}

// atHandleFID asks name_to_handle_at for the encoding fanotify reports
// (Linux 6.5); older kernels encode the same for the filesystems in
// localFS without it.
const atHandleFID = 0x200

// fileFID is f's fid as a fanotify FID record spells it: fsid, then a
// struct file_handle (length, type, bytes).
func fileFID(f *os.File, fsid [8]byte) (fid, error) {
	h, _, err := unix.NameToHandleAt(int(f.Fd()), "", unix.AT_EMPTY_PATH|atHandleFID)
	if errors.Is(err, unix.EINVAL) {
		h, _, err = unix.NameToHandleAt(int(f.Fd()), "", unix.AT_EMPTY_PATH)
	}
	if err != nil {
		return "", fmt.Errorf("name_to_handle_at: %v", err)
	}
	b := make([]byte, 16, 16+h.Size())
	copy(b, fsid[:])
	binary.NativeEndian.PutUint32(b[8:], uint32(h.Size()))
	binary.NativeEndian.PutUint32(b[12:], uint32(h.Type()))
	return fid(append(b, h.Bytes()...)), nil
}

// drain handles every event queued now, without blocking on the queue.
// It returns once the events of every write completed before the call
// were handled (by this call or by one it waited for).
func (w *watcher) drain() {
	if w.fd < 0 {
		return
	}
	w.drainMu.Lock()
	defer w.drainMu.Unlock()
	for !w.stopped {
		n, err := unix.Read(w.fd, w.buf)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.EAGAIN):
			return
		case err != nil:
			w.log.Error("fanotify read: trusting no staged file", zap.Error(err))
			w.onLost()
			return
		case n == 0:
			return
		}
		w.parse(w.buf[:n])
	}
}

// parse handles a buffer of events. drainMu must be held.
func (w *watcher) parse(b []byte) {
	const metaLen = 24
	for len(b) >= metaLen {
		evLen := int(binary.NativeEndian.Uint32(b[0:]))
		vers, infoOff := b[4], int(binary.NativeEndian.Uint16(b[6:]))
		mask := binary.NativeEndian.Uint64(b[8:])
		if evLen < metaLen || evLen > len(b) || vers != unix.FANOTIFY_METADATA_VERSION {
			w.log.Error("fanotify: malformed event: trusting no staged file", zap.Int("len", evLen), zap.Uint8("version", vers))
			w.onLost()
			return
		}
		if mask&unix.FAN_Q_OVERFLOW != 0 {
			w.onLost()
		}
		for rec := b[infoOff:evLen]; len(rec) >= 4; {
			typ, recLen := rec[0], int(binary.NativeEndian.Uint16(rec[2:]))
			if recLen < 4 || recLen > len(rec) {
				break
			}
			if typ == unix.FAN_EVENT_INFO_TYPE_FID && recLen >= 20 {
				n := int(binary.NativeEndian.Uint32(rec[12:]))
				if 20+n <= recLen {
					w.onChange(fid(rec[4 : 20+n]))
				}
			}
			rec = rec[recLen:]
		}
		b = b[evLen:]
	}
}

// read drains whenever events are queued, so invalidation does not wait
// for the next request, until close.
func (w *watcher) read() {
	defer w.wg.Done()
	for {
		fds := []unix.PollFd{{Fd: int32(w.fd), Events: unix.POLLIN}, {Fd: int32(w.wake), Events: unix.POLLIN}}
		_, err := unix.Poll(fds, -1)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || fds[1].Revents != 0 {
			return
		}
		if fds[0].Revents&unix.POLLIN != 0 {
			w.drain()
		}
	}
}

// close stops the reader and closes the group.
func (w *watcher) close() {
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
	unix.Close(w.wake)
	w.drainMu.Unlock()
}

// mode describes change detection on dev for stats: "fanotify" or
// "timestamps: WHY".
func (w *watcher) mode(dev uint64) string {
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
