package daemon

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"sync/atomic"
	"syscall"

	"go.uber.org/zap"

	"github.com/gdsfs/gdsfs/daemon/config"
	"github.com/gdsfs/gdsfs/daemon/handover"
	"github.com/gdsfs/gdsfs/fs"
	"github.com/gdsfs/gdsfs/gpu"
	"github.com/gdsfs/gdsfs/internal/metrics"
	"github.com/gdsfs/gdsfs/ipc"
	"github.com/gdsfs/gdsfs/staging"
	"github.com/gdsfs/gdsfs/staging/triggers"
	"github.com/gdsfs/gdsfs/staging/triggers/readahead"
)

// Request is one mount asked for, by `gdsfs mount` or the mount helper.
type Request struct {
	Config             string   // configuration file ("": the defaults)
	Sets               []string // key=value overrides, in order
	Detach             bool     // return once the mount is served (--daemon)
	Source, Mountpoint string
}

// Run loads the configuration and mounts, in the foreground until
// unmounted or stopped by a signal, or detached (Detach).
func (r Request) Run() error {
	cfg, err := config.Load(r.Config, r.Sets)
	if err != nil {
		if inBackground() { // the starter checked it: a file changed since
			return readyFromEnv().fail(UsageError{err})
		}
		return UsageError{err}
	}
	if r.Detach && !inBackground() {
		return r.background()
	}
	return runMount(cfg, r.Source, r.Mountpoint)
}

// Check loads the configuration the request names, as Run would, and
// mounts nothing.
func (r Request) Check() error {
	if _, err := config.Load(r.Config, r.Sets); err != nil {
		return UsageError{err}
	}
	return nil
}

// daemon is one mount with its cache and lease server.
type daemon struct {
	cfg     *config.Config
	log     *zap.Logger
	devs    []gpu.Device
	cache   *staging.Cache
	ipc     *ipc.Server
	fs      *fs.Server
	served  atomic.Pointer[fs.Server] // fs once mounted, for the metrics endpoint
	metrics *metrics.Metrics          // nil unless metrics.listen is set
	// stopEvents ends the metrics' subscription to staging events.
	stopEvents func()
	version    string
	// source and absMnt are SOURCE and MOUNTPOINT, absolute.
	source, absMnt string
	// handedOver: a successor took the mount; stop leaves everything it
	// serves alone.
	handedOver bool
	// keptForRestart: the descriptor store holds the mount for the
	// unit's restart (keepForRestart); this daemon exits.
	keptForRestart bool
	store          *fdStore // nil unless the service manager keeps descriptors
	// adopted is what the cache took over from a predecessor.
	adopted staging.AdoptReport
	// successorLn is the hand-over socket's listener (nil: none); letGo
	// closes it, keeping the path for the successor's own.
	successorLn *net.UnixListener
}

func runMount(cfg *config.Config, source, mnt string) error {
	ready := readyFromEnv()
	log, logFile, err := newLogger(cfg.Log)
	if err != nil {
		return ready.fail(UsageError{fmt.Errorf("log: %w", err)})
	}
	if logFile != nil {
		defer logFile.Close()
	}
	defer log.Sync()
	d := &daemon{cfg: cfg, log: log}
	// Signals that arrive while starting are handled once mounted.
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, restartSignal)
	stopHangups := d.handleHangups(logFile)
	defer stopHangups()
	var pred *handover.Conn
	passed, passErr := listenFiles()
	recovered := d.recoverFromStore(passed, passErr, source, mnt)
	var src, absMnt string
	if !recovered {
		pred, src, absMnt, err = predecessor(source, mnt)
	}
	switch {
	case recovered:
		if err = d.startMetrics(); err != nil {
			log.Error("metrics endpoint not started", zap.Error(err))
			err = nil
		}
		d.observeLoads()
	case err != nil:
		return ready.fail(err)
	case pred != nil:
		d.source, d.absMnt = src, absMnt
		err = d.takeOver(pred, src, mnt, absMnt)
		if err == nil {
			err = d.startMetrics()
			if err != nil { // the mount is served: metrics are not worth dropping it for
				log.Error("metrics endpoint not started", zap.Error(err))
				err = nil
			}
			d.observeLoads()
		}
	default:
		err = d.start(source, mnt)
	}
	if err != nil {
		d.stop()
		return ready.fail(err)
	}
	d.served.Store(d.fs)
	log.Info("mounted", zap.String("source", d.source), zap.String("mountpoint", d.fs.Mountpoint()),
		zap.String("device", d.devs[0].Name()), zap.Bool("passthrough", d.fs.Stats().Passthrough),
		zap.String("socket", d.ipc.Path()), zap.Bool("taken_over", pred != nil))
	go d.ipc.Serve()
	successors, stopSuccessors := d.listenSuccessors(d.absMnt)
	if err := d.startFDStore(); err != nil {
		log.Warn("descriptor store not kept: a crash loses the mount and the cache", zap.Error(err))
	}
	if err := sdNotify("READY=1\nSTATUS=serving " + d.fs.Mountpoint()); err != nil {
		log.Warn("cannot tell systemd the mount is ready", zap.Error(err))
	}
	if pred != nil {
		// The predecessor exits once pred closes: the service manager
		// must know this process as the main one by then.
		if err := sdBarrier(); err != nil {
			log.Warn("systemd did not confirm the new main process", zap.Error(err))
		}
		pred.Close()
	}
	ready.ok()
	unmounted := make(chan struct{})
	go func() { d.fs.Wait(); close(unmounted) }()
	d.serveUntilStopped(sigs, unmounted, successors)
	stopSuccessors()
	d.stop()
	if d.handedOver && !d.keptForRestart && d.cfg.Shutdown.AfterHandover == "wait" {
		log.Info("handed the mount over: waiting for SIGTERM or SIGINT (shutdown.after_handover: wait)")
		sig := <-sigs
		log.Info("exiting: the successor serves the mount", zap.String("signal", sig.String()))
	}
	return nil
}

func (d *daemon) start(source, mnt string) error {
	if err := clearDeadMount(mnt, d.log); err != nil {
		return err
	}
	source, absMnt, err := fs.CheckPaths(source, mnt)
	if err != nil {
		return UsageError{err}
	}
	d.source, d.absMnt = source, absMnt
	if err := d.startMetrics(); err != nil {
		return err
	}
	if err := d.newCache(source); err != nil {
		return err
	}
	d.ipc, err = ipc.Listen(d.ipcConfig(source, absMnt))
	if err != nil {
		return err
	}
	d.fs, err = fs.Mount(d.fsConfig(source, mnt))
	return err
}

// newCache opens the devices and starts the cache on them.
func (d *daemon) newCache(source string) error {
	cfg := d.cfg
	if soft, hard, err := staging.RaiseNoFile(); err != nil {
		d.log.Warn("descriptor limit not raised", zap.Error(err))
	} else {
		d.log.Info("descriptor limit", zap.Uint64("soft", soft), zap.Uint64("hard", hard))
	}
	var err error
	if d.devs == nil { // a successor opened them before the hand-over
		if d.devs, err = openDevices(cfg.Staging, d.log); err != nil {
			return err
		}
	}
	d.version = d.versionText()
	d.cache, err = staging.New(context.Background(), staging.Config{
		Source: source, Options: cfg.Staging, IO: cfg.IO, Devices: d.devs, Log: d.log,
		Queue:     triggers.NewQueue(cfg.Staging.PrefetchQueue, cfg.Staging.PrefetchWorkers, d.log.Named("staging")),
		AfterRead: triggers.NewAfterRead(triggers.AfterReadOptions{DeferLimit: cfg.Staging.DeferLimit, MapMin: triggers.SettleMapMin}),
		ReadAhead: readahead.NewExecutor(nil),
	})
	if err != nil {
		return err
	}
	d.observeLoads()
	return nil
}

// observeLoads feeds the metrics' histograms from the cache's events.
func (d *daemon) observeLoads() {
	if d.metrics != nil && d.cache != nil && d.stopEvents == nil {
		d.stopEvents = d.cache.Subscribe(func(e staging.Event) {
			if e.HandedOver {
				return // loaded by a predecessor: counted there
			}
			observeLoad(d.metrics, loadEvent{State: e.State, LoadPath: e.LoadPath,
				Bytes: e.Bytes, Duration: e.Duration, Err: e.Err})
		})
	}
}

func (d *daemon) ipcConfig(source, absMnt string) ipc.Config {
	return ipc.Config{Source: source, Mountpoint: absMnt, Options: d.cfg.IPC, Cache: d.cache, Log: d.log,
		Observe: d.observeRequest, NodeID: d.nodeID}
}

// nodeID is the mount's inode number of a backing inode, once mounted.
func (d *daemon) nodeID(dev, ino uint64) (uint64, bool) {
	if srv := d.served.Load(); srv != nil {
		return srv.NodeID(dev, ino)
	}
	return 0, false
}

func (d *daemon) fsConfig(source, mnt string) fs.Config {
	return fs.Config{Source: source, Mountpoint: mnt, Options: d.cfg.FUSE, Stager: d.cache, Watch: d.cache.Watcher(),
		Controls: d.controls, Journal: fdStoreEnabled(), Log: d.log}
}

// stop releases what start made, in reverse order; after a hand-over
// only what is this process's own (letGo already let go of the rest).
func (d *daemon) stop() {
	if d.store != nil {
		d.store.stop(true) // a clean stop: the next start mounts afresh
		d.store = nil
	}
	if d.metrics != nil {
		d.metrics.Close()
	}
	if d.ipc != nil {
		d.ipc.Close()
	}
	if d.stopEvents != nil {
		d.stopEvents()
	}
	if d.cache != nil {
		d.cache.Close()
	}
	closeDevices(d.devs)
}

// absPath is p made absolute, or p where that fails (the error shows
// later, naming p).
func absPath(p string) string {
	if a, err := filepath.Abs(p); err == nil {
		return a
	}
	return p
}
