package watch

import (
	"bytes"
	"encoding/binary"
	"errors"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// Drain handles every event queued now, without blocking on the queue.
// It returns once the events of every change completed before the call
// were handed to the subscribers (by this call or by one it waited for).
func (w *Watcher) Drain() {
	if w.fd < 0 {
		return
	}
	w.drainMu.Lock()
	defer w.drainMu.Unlock()
	if w.mounts != nil && !w.stopped {
		w.drainMounts()
	}
	for !w.stopped {
		n, err := unix.Read(w.fd, w.buf)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.EAGAIN):
			return
		case err != nil:
			w.log.Error("fanotify read: trusting nothing seen before", zap.Error(err))
			w.lost()
			return
		case n == 0:
			return
		}
		w.parse(w.buf[:n])
	}
}

// drainMounts tells subscribers of the mount points whose mounts changed.
// drainMu must be held.
func (w *Watcher) drainMounts() {
	points, err := w.mounts.changed()
	if err != nil {
		w.log.Error("mount table: trusting nothing seen before", zap.Error(err))
		w.lost()
		return
	}
	subs := w.subscribers()
	for _, p := range points {
		for _, s := range subs {
			if s.Mounts != nil {
				s.Mounts(p)
			}
		}
	}
}

// lost tells every subscriber that events were lost. drainMu must be held.
func (w *Watcher) lost() {
	for _, s := range w.subscribers() {
		if s.Lost != nil {
			s.Lost()
		}
	}
}

func (w *Watcher) subscribers() []Subscriber {
	w.subMu.Lock()
	defer w.subMu.Unlock()
	return w.subs
}

// parse handles a buffer of events. drainMu must be held.
func (w *Watcher) parse(b []byte) {
	const metaLen = 24
	subs := w.subscribers()
	for len(b) >= metaLen {
		evLen := int(binary.NativeEndian.Uint32(b[0:]))
		vers, infoOff := b[4], int(binary.NativeEndian.Uint16(b[6:]))
		mask := binary.NativeEndian.Uint64(b[8:])
		if evLen < metaLen || evLen > len(b) || vers != unix.FANOTIFY_METADATA_VERSION || infoOff > evLen {
			w.log.Error("fanotify: malformed event: trusting nothing seen before", zap.Int("len", evLen), zap.Uint8("version", vers))
			w.lost()
			return
		}
		if mask&unix.FAN_Q_OVERFLOW != 0 {
			w.lost()
		}
		c := change(mask, b[infoOff:evLen])
		for _, s := range subs {
			if mask&modifyMask != 0 && c.Self != "" && s.Modified != nil {
				s.Modified(c.Self)
			}
			if s.Entries != nil && (c.Self != "" || c.Dir != "") {
				s.Entries(c)
			}
		}
		b = b[evLen:]
	}
}

// change reads an event's info records: FAN_EVENT_INFO_TYPE_FID (the
// object), _DFID_NAME and _DFID (its directory, and its name there).
func change(mask uint64, rec []byte) Change {
	c := Change{Mask: mask}
	for len(rec) >= 4 {
		typ, recLen := rec[0], int(binary.NativeEndian.Uint16(rec[2:]))
		if recLen < 4 || recLen > len(rec) {
			break
		}
		if recLen >= 20 {
			n := int(binary.NativeEndian.Uint32(rec[12:]))
			if 20+n <= recLen {
				id := FID(rec[4 : 20+n])
				switch typ {
				case unix.FAN_EVENT_INFO_TYPE_FID:
					c.Self = id
				case unix.FAN_EVENT_INFO_TYPE_DFID_NAME:
					name := rec[20+n : recLen]
					if i := bytes.IndexByte(name, 0); i >= 0 {
						name = name[:i]
					}
					c.Dir, c.Name = id, string(name)
				case unix.FAN_EVENT_INFO_TYPE_DFID:
					c.Dir, c.Name = id, "."
				}
			}
		}
		rec = rec[recLen:]
	}
	return c
}

// read drains whenever events are queued, so subscribers do not wait for
// the next request, until Close.
func (w *Watcher) read() {
	defer w.wg.Done()
	for {
		fds := []unix.PollFd{{Fd: int32(w.fd), Events: unix.POLLIN}, {Fd: int32(w.wake), Events: unix.POLLIN}}
		if w.mounts != nil {
			fds = append(fds, unix.PollFd{Fd: int32(w.mounts.wake), Events: unix.POLLPRI})
		}
		_, err := unix.Poll(fds, -1)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || fds[1].Revents != 0 {
			return
		}
		if fds[0].Revents&unix.POLLIN != 0 || len(fds) > 2 && fds[2].Revents != 0 {
			w.Drain()
		}
	}
}
