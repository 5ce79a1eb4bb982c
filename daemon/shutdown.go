package daemon

import (
	"os"
	"os/signal"
	"syscall"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/daemon/handover"
	"github.com/gdsfs/gdsfs/internal/mountinfo"
)

// serveUntilStopped returns once the mount is gone: unmounted from
// outside (umount, gdsfs umount), stopped by a signal (shutdown), or
// handed over to a successor (handOver).
func (d *daemon) serveUntilStopped(sigs <-chan os.Signal, unmounted <-chan struct{}, successors <-chan successor) {
	for {
		select {
		case <-unmounted:
			d.log.Info("unmounted", zap.String("mountpoint", d.fs.Mountpoint()))
			return
		case sig := <-sigs:
			if sig == restartSignal && d.keepForRestart() {
				return
			}
			d.shutdown(sig, sigs, unmounted)
			return
		case c := <-successors:
			if d.handOver(c) {
				return
			}
		}
	}
}

// restartSignal is the one a service manager sends to stop the daemon
// for a restart (systemd's RestartKillSignal=): the mount and the cache
// are kept in its descriptor store for the next daemon.
const restartSignal = syscall.SIGUSR2

// keepForRestart puts everything a hand-over would send into the
// service manager's descriptor store, stops serving without unmounting
// and lets go: the unit's restart adopts it all as a successor adopts a
// hand-over (the open files, the consumers' connections and their
// leases included). False, with a log line, when there is no store or
// it cannot be written: the daemon then stops as on SIGTERM.
func (d *daemon) keepForRestart() bool {
	if d.store == nil {
		d.log.Warn("stopping for a restart without a descriptor store ($FDSTORE, FileDescriptorStoreMax=): the mount ends and the cache is dropped",
			zap.String("signal", restartSignal.String()))
		return false
	}
	st, files, resume, err := d.handoff()
	if err == nil {
		err = d.store.keep(st, files)
		handover.CloseFiles(files)
		if err != nil {
			// What the keep stored is of the paused daemon: the store
			// goes back to what any running daemon keeps there, so that
			// a crash while it stops recovers what it serves then.
			d.store.stop(true)
			d.store = nil
			resume()
			if serr := d.startFDStore(); serr != nil {
				d.log.Warn("descriptor store not kept: a crash loses the mount and the cache", zap.Error(serr))
			}
		}
	}
	if err != nil {
		d.log.Error("cannot keep the mount for the restart: stopping", zap.Error(err))
		return false
	}
	if err := sdNotify("STOPPING=1\nSTATUS=kept " + d.absMnt + " in the descriptor store for the restart"); err != nil {
		d.log.Warn("cannot tell systemd the daemon is stopping", zap.Error(err))
	}
	d.store.stop(false)
	d.store = nil
	d.letGo()
	d.keptForRestart = true
	d.log.Info("kept the mount, the leases and the cache in the descriptor store for the restart",
		zap.String("mountpoint", d.absMnt), zap.String("signal", restartSignal.String()))
	return true
}

// shutdown stops the mount taking new opens, waits up to shutdown.grace
// for the open files to close, and unmounts; where files are still open
// after the grace period (or a second signal), it detaches the mount
// lazily. The log says which.
func (d *daemon) shutdown(sig os.Signal, sigs <-chan os.Signal, unmounted <-chan struct{}) {
	mnt, grace := d.fs.Mountpoint(), d.cfg.Shutdown.Grace
	open, idle := d.fs.Drain()
	if err := sdNotify("STOPPING=1"); err != nil { // after Drain: opens from now on fail
		d.log.Warn("cannot tell systemd the mount is stopping", zap.Error(err))
	}
	d.log.Info("stopping: new opens are refused", zap.String("signal", sig.String()),
		zap.Int("open_files", open), zap.Duration("grace", grace))
	timer := time.NewTimer(grace)
	defer timer.Stop()
	for waiting := true; waiting; {
		if err := d.fs.Unmount(); err == nil {
			d.log.Info("unmounted cleanly", zap.String("mountpoint", mnt), zap.Int("open_files_at_signal", open))
			return
		}
		select {
		case <-idle:
			idle = nil // every file closed: try again; a working directory may still hold it
		case <-unmounted:
			d.log.Info("unmounted from outside while stopping", zap.String("mountpoint", mnt))
			return
		case <-timer.C:
			waiting = false
		case s := <-sigs:
			d.log.Info("second signal: not waiting for open files", zap.String("signal", s.String()))
			waiting = false
		}
	}
	users := mountinfo.Users(mnt)
	if err := unix.Unmount(mnt, unix.MNT_DETACH); err != nil {
		d.log.Error("cannot detach the mount", zap.String("mountpoint", mnt), zap.Error(err))
		return
	}
	d.log.Warn("files still open after the grace period: detached the mount lazily (umount -l); their next reads fail",
		zap.String("mountpoint", mnt), zap.Int("open_files", d.fs.OpenFiles()), zap.Strings("used_by", users))
}

// handleHangups reopens log.file on each SIGHUP (log rotation: the old
// file was renamed) until the returned function is called. Without a log
// file a hangup is logged and ignored: a foreground daemon outlives the
// terminal it was started from.
func (d *daemon) handleHangups(lf *logFile) (stop func()) {
	hups := make(chan os.Signal, 1)
	signal.Notify(hups, syscall.SIGHUP)
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		for {
			select {
			case <-hups:
			case <-done:
				return
			}
			if lf == nil {
				d.log.Info("SIGHUP: no log.file to reopen; going on")
				continue
			}
			if err := lf.Reopen(); err != nil {
				d.log.Error("SIGHUP: cannot reopen log.file; logging on to the old one", zap.Error(err))
				continue
			}
			d.log.Info("SIGHUP: reopened log.file", zap.String("file", lf.path))
		}
	}()
	return func() {
		signal.Stop(hups)
		close(done)
		<-finished
	}
}
