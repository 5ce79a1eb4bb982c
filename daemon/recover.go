package daemon

import (
	"fmt"
	"os"

	"go.uber.org/zap"

	"github.com/gdsfs/gdsfs/daemon/handover"
	"github.com/gdsfs/gdsfs/staging"
)

// recoverFromStore starts the daemon from what the service manager's
// descriptor store passed back after the previous daemon died (a crash,
// SIGKILL) or stopped for the unit's restart (keepForRestart): the mount
// it served goes on. False when there is nothing to recover from or it
// cannot be used (passErr: what was wrong with the passing itself): then
// every stored descriptor is closed, which ends the connection it held
// (a dead mount the normal start clears), and the store emptied, with a
// log line saying why.
func (d *daemon) recoverFromStore(passed map[string]*os.File, passErr error, source, mnt string) bool {
	if len(passed) == 0 {
		return false
	}
	names := make([]string, 0, len(passed))
	for n := range passed {
		names = append(names, n)
	}
	src, absMnt, err := canonicalPaths(source, mnt)
	if err == nil {
		err = passErr
	}
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
	// Closing every stored descriptor (ours here, the manager's by
	// removing them) ends the stored FUSE connection: a dead mount the
	// normal start clears, whatever is mounted where the state says.
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
