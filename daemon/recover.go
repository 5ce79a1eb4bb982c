package daemon

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/daemon/handover"
	"github.com/gdsfs/gdsfs/internal/mountinfo"
	"github.com/gdsfs/gdsfs/staging"
)

// recoverFromStore starts the daemon from what the service manager's
// descriptor store passed back after the previous daemon died (a crash,
// SIGKILL): the mount it served goes on. False when there is nothing to
// recover from or it cannot be used: then the connection it held is
// aborted (a dead mount the normal start clears) and the store emptied,
// with a log line saying why.
func (d *daemon) recoverFromStore(passed map[string]*os.File, source, mnt string) bool {
	if len(passed) == 0 {
		return false
	}
	names := make([]string, 0, len(passed))
	for n := range passed {
		names = append(names, n)
	}
	src, absMnt, err := canonicalPaths(source, mnt)
	var st storedState
	var hs handover.State
	var files map[string][]*os.File
	if err == nil {
		st, hs, files, err = fromStore(passed)
	}
	if err == nil && (st.Source != src || st.Mountpoint != absMnt) {
		err = fmt.Errorf("it holds SOURCE %s on %s, not SOURCE %s on %s", st.Source, st.Mountpoint, src, absMnt)
	}
	if err == nil {
		d.source, d.absMnt = src, absMnt
		err = d.adopt(hs, files, src, absMnt)
	}
	if err == nil {
		err = d.fs.Serve() // nobody else serves the stored connection
	}
	if err == nil {
		d.log.Info("recovered the mount from the service manager's descriptor store",
			zap.String("mountpoint", absMnt))
		// The service manager keeps every descriptor stored under a
		// name, and drops one it holds already under another: this
		// daemon stores its own afresh (startFDStore) in an empty store.
		for _, n := range names {
			if n == storeStateA || n == storeStateB {
				passed[n].Close()
			}
			if err := storeRemove(n); err != nil {
				d.log.Warn("descriptor store not cleared", zap.String("name", n), zap.Error(err))
			}
		}
		return true
	}
	d.log.Warn("descriptor store not used: mounting afresh", zap.Error(err))
	d.abandon() // what adopt took before it failed: the fresh start makes its own
	d.adopted = staging.AdoptReport{}
	if at := cmp.Or(st.Mountpoint, absMnt); passed[storeFUSE+".0"] != nil && at != "" {
		// Nobody would serve it, and nobody could tell it is dead.
		if err := abortConnection(at); err != nil {
			d.log.Warn("the stored FUSE connection was not aborted", zap.Error(err))
		}
	}
	for _, n := range names {
		if f := passed[n]; f != nil {
			f.Close()
		}
		if err := storeRemove(n); err != nil {
			d.log.Warn("descriptor store not cleared", zap.String("name", n), zap.Error(err))
		}
	}
	// The manager's copies (the lease socket's listener among them) are
	// gone before the fresh start binds the same paths.
	if err := sdBarrier(); err != nil {
		d.log.Warn("descriptor store not confirmed cleared", zap.Error(err))
	}
	return false
}

// abortConnection ends the FUSE connection of the mount on mnt: its
// requests fail with ENOTCONN and the mount is dead (clearDeadMount
// unmounts it).
func abortConnection(mnt string) error {
	n, err := mountinfo.FUSEConnection(mnt)
	if err != nil {
		return err
	}
	const fusectl = "/sys/fs/fuse/connections"
	abort := filepath.Join(fusectl, fmt.Sprint(n), "abort")
	err = os.WriteFile(abort, []byte("1"), 0)
	if errors.Is(err, os.ErrNotExist) {
		// fusectl is not mounted (systemd mounts it at boot; a bare
		// machine or a container may not have).
		if merr := unix.Mount("fusectl", fusectl, "fusectl", 0, ""); merr != nil {
			return fmt.Errorf("FUSE connection %d of %s: fusectl is not mounted on %s and cannot be: %w", n, mnt, fusectl, merr)
		}
		err = os.WriteFile(abort, []byte("1"), 0)
	}
	return err
}
