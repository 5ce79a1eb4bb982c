package daemon

import (
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/internal/mountinfo"
)

// mountAt says what is mounted on abs (absolute): its type, and whether it
// is a FUSE mount whose daemon is gone. After a kill -9 the mount stays,
// and accesses to it fail with ENOTCONN ("transport endpoint is not
// connected"). statfs tells for sure: the kernel always asks the daemon (a
// stat may still be answered from the attribute cache).
func mountAt(abs string) (fstype string, mounted, dead bool) {
	fstype, mounted = mountinfo.MountedAt(abs)
	if !mounted || !strings.HasPrefix(fstype, "fuse") {
		return fstype, mounted, false
	}
	err := unix.Statfs(abs, &unix.Statfs_t{})
	return fstype, true, errors.Is(err, unix.ENOTCONN)
}

// unmountDead unmounts a dead mount on abs, detaching it lazily where it
// is busy (busy says why).
func unmountDead(abs string) (busy error, err error) {
	busy = mountinfo.Unmount(abs, false)
	if busy == nil {
		return nil, nil
	}
	if err := mountinfo.Unmount(abs, true); err != nil {
		return busy, err
	}
	return busy, nil
}

// clearDeadMount unmounts a gdsfs mount on mnt whose daemon is gone. A
// dead mount of another filesystem is left alone, with the command that
// clears it.
func clearDeadMount(mnt string, log *zap.Logger) error {
	abs, err := filepath.Abs(mnt)
	if err != nil {
		return nil // CheckPaths reports it
	}
	fstype, _, dead := mountAt(abs)
	if !dead {
		return nil // nothing there, or alive: CheckPaths says it is busy
	}
	if fstype != "fuse.gdsfs" {
		return UsageError{fmt.Errorf("MOUNTPOINT %s: a dead %s mount (transport endpoint is not connected); clear it with: umount -l %s", mnt, fstype, abs)}
	}
	busy, err := unmountDead(abs)
	switch {
	case err != nil:
		return fmt.Errorf("MOUNTPOINT %s: a dead gdsfs mount (its daemon is gone) that cannot be unmounted (%v); as root run: gdsfs umount --if-dead %s", mnt, err, abs)
	case busy != nil:
		log.Warn("MOUNTPOINT was a dead gdsfs mount (its daemon is gone) and busy; detached it lazily",
			zap.String("mountpoint", abs), zap.NamedError("busy", busy))
	default:
		log.Warn("MOUNTPOINT was a dead gdsfs mount (its daemon is gone: transport endpoint is not connected); unmounted it",
			zap.String("mountpoint", abs))
	}
	return nil
}

// UnmountIfDead unmounts the gdsfs mount on mnt (absolute) if its daemon
// is gone (mountAt), and says on w what it did.
func UnmountIfDead(mnt string, w io.Writer) (unmounted bool, err error) {
	fstype, mounted, dead := mountAt(mnt)
	switch {
	case !mounted:
		fmt.Fprintf(w, "gdsfs: %s: not a mount point; nothing to do\n", mnt)
		return false, nil
	case fstype != "fuse.gdsfs":
		fmt.Fprintf(w, "gdsfs: %s: a %s mount, not gdsfs; left alone\n", mnt, fstype)
		return false, nil
	case !dead:
		fmt.Fprintf(w, "gdsfs: %s: served by a live daemon; left alone\n", mnt)
		return false, nil
	}
	busy, err := unmountDead(mnt)
	switch {
	case err != nil:
		return false, fmt.Errorf("%s: a dead gdsfs mount that cannot be unmounted: %w", mnt, err)
	case busy != nil:
		fmt.Fprintf(w, "gdsfs: %s: a dead gdsfs mount (its daemon is gone), busy: detached it lazily\n", mnt)
	default:
		fmt.Fprintf(w, "gdsfs: %s: a dead gdsfs mount (its daemon is gone): unmounted it\n", mnt)
	}
	return true, nil
}
