package daemon

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sync/atomic"
	"syscall"

	"go.uber.org/zap"

	"github.com/gdsfs/gdsfs/daemon/config"
	"github.com/gdsfs/gdsfs/fs"
	"github.com/gdsfs/gdsfs/gpu"
	"github.com/gdsfs/gdsfs/internal/metrics"
	"github.com/gdsfs/gdsfs/ipc"
	"github.com/gdsfs/gdsfs/staging"
	"github.com/gdsfs/gdsfs/staging/triggers"
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
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	stopHangups := d.handleHangups(logFile)
	defer stopHangups()
	if err := d.start(source, mnt); err != nil {
		d.stop()
		return ready.fail(err)
	}
	d.served.Store(d.fs)
	log.Info("mounted", zap.String("source", source), zap.String("mountpoint", d.fs.Mountpoint()),
		zap.String("device", d.devs[0].Name()), zap.Bool("passthrough", d.fs.Stats().Passthrough),
		zap.String("socket", d.ipc.Path()))
	go d.ipc.Serve()
	if err := sdNotify("READY=1\nSTATUS=serving " + d.fs.Mountpoint()); err != nil {
		log.Warn("cannot tell systemd the mount is ready", zap.Error(err))
	}
	ready.ok()
	unmounted := make(chan struct{})
	go func() { d.fs.Wait(); close(unmounted) }()
	d.serveUntilStopped(sigs, unmounted)
	d.stop()
	return nil
}

func (d *daemon) start(source, mnt string) error {
	cfg := d.cfg
	if err := clearDeadMount(mnt, d.log); err != nil {
		return err
	}
	source, absMnt, err := fs.CheckPaths(source, mnt)
	if err != nil {
		return UsageError{err}
	}
	if err := d.startMetrics(); err != nil {
		return err
	}
	if soft, hard, err := staging.RaiseNoFile(); err != nil {
		d.log.Warn("descriptor limit not raised", zap.Error(err))
	} else {
		d.log.Info("descriptor limit", zap.Uint64("soft", soft), zap.Uint64("hard", hard))
	}
	if d.devs, err = openDevices(cfg.Staging, d.log); err != nil {
		return err
	}
	d.version = d.versionText()
	d.cache, err = staging.New(context.Background(), staging.Config{
		Source: source, Options: cfg.Staging, IO: cfg.IO, Devices: d.devs, Log: d.log,
		Queue: triggers.NewQueue(cfg.Staging.PrefetchQueue, cfg.Staging.PrefetchWorkers, d.log.Named("staging")),
	})
	if err != nil {
		return err
	}
	if d.metrics != nil {
		d.stopEvents = d.cache.Subscribe(func(e staging.Event) {
			observeLoad(d.metrics, loadEvent{State: e.State, LoadPath: e.LoadPath,
				Bytes: e.Bytes, Duration: e.Duration, Err: e.Err})
		})
	}
	d.ipc, err = ipc.Listen(ipc.Config{Source: source, Mountpoint: absMnt, Options: cfg.IPC, Cache: d.cache, Log: d.log,
		Observe: d.observeRequest})
	if err != nil {
		return err
	}
	d.fs, err = fs.Mount(fs.Config{
		Source: source, Mountpoint: mnt, Options: cfg.FUSE, Stager: d.cache, Watch: d.cache.Watcher(),
		Controls: d.controls, Log: d.log,
	})
	return err
}

// stop releases what start made, in reverse order.
func (d *daemon) stop() {
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
