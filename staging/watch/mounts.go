package watch

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// A filesystem mounted on a directory, or unmounted from one, raises no
// fanotify event on the directory's filesystem. The mount table of this
// process's mount namespace says when it changes: poll(2) on
// /proc/self/mountinfo reports POLLPRI once per open file after each
// change, and the change is counted before mount(2) or umount(2)
// returns. One descriptor wakes the reader; another, read only with
// drainMu held, lets Drain see every change completed before it.

// mountTable follows the mount table and names the mount points that
// changed.
type mountTable struct {
	wake  int               // the reader's descriptor of mountinfo
	check int               // Drain's; guarded by drainMu
	seen  map[string]string // each mount's line up to its mount point -> the mount point; guarded by drainMu
}

const mountinfo = "/proc/self/mountinfo"

// openMounts opens the mount table and reads it.
func openMounts() (*mountTable, error) {
	wake, err := unix.Open(mountinfo, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", mountinfo, err)
	}
	check, err := unix.Open(mountinfo, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		unix.Close(wake)
		return nil, fmt.Errorf("open %s: %w", mountinfo, err)
	}
	t := &mountTable{wake: wake, check: check}
	if _, err := t.reread(); err != nil {
		t.close()
		return nil, err
	}
	return t, nil
}

func (t *mountTable) close() {
	unix.Close(t.wake)
	unix.Close(t.check)
}

// changed returns the mount points of mounts added or removed since the
// last call, without blocking. drainMu must be held.
func (t *mountTable) changed() ([]string, error) {
	fds := []unix.PollFd{{Fd: int32(t.check), Events: unix.POLLPRI}}
	for {
		_, err := unix.Poll(fds, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("poll %s: %w", mountinfo, err)
		}
		break
	}
	if fds[0].Revents&(unix.POLLPRI|unix.POLLERR) == 0 {
		return nil, nil
	}
	return t.reread()
}

// reread reads the table and returns the mount points of the mounts it
// gained or lost. drainMu must be held (or t not yet shared).
func (t *mountTable) reread() ([]string, error) {
	b, err := readAll(t.check)
	if err != nil {
		return nil, err
	}
	now := map[string]string{}
	for line := range bytes.SplitSeq(b, []byte{'\n'}) {
		// ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS...
		f := strings.SplitN(string(line), " ", 6)
		if len(f) < 6 {
			continue
		}
		now[strings.Join(f[:5], " ")] = unescape(f[4])
	}
	var points []string
	for k, p := range t.seen {
		if _, ok := now[k]; !ok {
			points = append(points, p)
		}
	}
	if t.seen != nil {
		for k, p := range now {
			if _, ok := t.seen[k]; !ok {
				points = append(points, p)
			}
		}
	}
	t.seen = now
	return points, nil
}

func readAll(fd int) ([]byte, error) {
	if _, err := unix.Seek(fd, 0, 0); err != nil {
		return nil, fmt.Errorf("seek %s: %w", mountinfo, err)
	}
	var b []byte
	buf := make([]byte, 64<<10)
	for {
		n, err := unix.Read(fd, buf)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", mountinfo, err)
		}
		if n == 0 {
			return b, nil
		}
		b = append(b, buf[:n]...)
	}
}

// unescape undoes mountinfo's octal escapes (\040 for a space, ...).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
