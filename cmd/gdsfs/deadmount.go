package main

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/internal/mountinfo"
)

// clearDeadMount unmounts a gdsfs mount on mnt whose daemon is gone: after
// a kill -9 the mount stays, and accesses to it fail with ENOTCONN
// ("transport endpoint is not connected"). statfs tells for sure: the
// kernel always asks the daemon (a stat may still be answered from the
// attribute cache). A dead mount of another filesystem is left alone, with
// the command that clears it.
func clearDeadMount(mnt string, log *zap.Logger) error {
	abs, err := filepath.Abs(mnt)
	if err != nil {
		return nil // CheckPaths reports it
	}
	fstype, ok := mountinfo.MountedAt(abs)
	if !ok || !strings.HasPrefix(fstype, "fuse") {
		return nil
	}
	var st unix.Statfs_t
	if err := unix.Statfs(abs, &st); !errors.Is(err, unix.ENOTCONN) {
		return nil // alive: CheckPaths says it is busy
	}
	if fstype != "fuse.gdsfs" {
		return usageError{fmt.Errorf("MOUNTPOINT %s: a dead %s mount (transport endpoint is not connected); clear it with: umount -l %s", mnt, fstype, abs)}
	}
	if err := mountinfo.Unmount(abs, false); err != nil {
		if lerr := mountinfo.Unmount(abs, true); lerr != nil {
			return fmt.Errorf("MOUNTPOINT %s: a dead gdsfs mount (its daemon is gone) that cannot be unmounted (%v); as root run: gdsfs umount --lazy %s", mnt, lerr, abs)
		}
		log.Warn("MOUNTPOINT was a dead gdsfs mount (its daemon is gone) and busy; detached it lazily",
			zap.String("mountpoint", abs), zap.NamedError("busy", err))
		return nil
	}
	log.Warn("MOUNTPOINT was a dead gdsfs mount (its daemon is gone: transport endpoint is not connected); unmounted it",
		zap.String("mountpoint", abs))
	return nil
}
