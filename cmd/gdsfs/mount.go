package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sync/atomic"
	"syscall"

	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"github.com/gdsfs/gdsfs/fs"
	"github.com/gdsfs/gdsfs/gpu"
	"github.com/gdsfs/gdsfs/internal/config"
	"github.com/gdsfs/gdsfs/internal/metrics"
	"github.com/gdsfs/gdsfs/ipc"
	"github.com/gdsfs/gdsfs/staging"
)

func mountCmd() *cobra.Command {
	var r mountRequest
	c := &cobra.Command{
		Use:   "mount [--daemon] [--config FILE] [--set key=value]... SOURCE MOUNTPOINT",
		Short: "Mount SOURCE on MOUNTPOINT (foreground until SIGTERM, or --daemon)",
		Long: `Mounts SOURCE on MOUNTPOINT and serves it until unmounted or stopped by
SIGINT or SIGTERM. On a stop signal the mount refuses new opens, waits up to
shutdown.grace for open files to close, then unmounts (lazily, if files are
still open) and exits 0. SIGHUP reopens log.file (after log rotation) and
changes nothing else.

--daemon detaches once the mount is served: the exit status says whether it
came up, and errors are printed before it returns. Under systemd run it in the
foreground (Type=notify): it signals READY=1 once mounted and STOPPING=1 on
stop. A dead gdsfs mount left on MOUNTPOINT by a killed daemon is unmounted
first.

Installed as /sbin/mount.fuse.gdsfs (make install), gdsfs is the mount helper
of "mount -t fuse.gdsfs SOURCE MOUNTPOINT -o OPTIONS" and of /etc/fstab:

  /data/src  /gds  fuse.gdsfs  allow_other,noexec,staging.capacity=8GiB,_netdev  0 0

OPTIONS are config keys (key.sub=value, as --set), config=FILE, ro
(fuse.read_only=true and a read-only kernel mount: control files refuse
writes too), noexec, nosuid, nodev (kernel mount flags, fuse.mount_flags;
nosuid and nodev are always set, suid and dev are refused), allow_other,
debug, and mount's own (defaults, noauto, _netdev, nofail, user, x-*, ...),
which are accepted and ignored; rw, which mount passes for every line,
leaves fuse.read_only as configured. The helper mounts with --daemon: it
returns once the mount is served.`,
		Args: exactArgs("SOURCE", "MOUNTPOINT"),
		RunE: func(cmd *cobra.Command, args []string) error {
			r.source, r.mountpoint = args[0], args[1]
			return r.run()
		},
	}
	c.Flags().BoolVar(&r.daemon, "daemon", false, "detach once mounted; the exit status says whether the mount came up")
	c.Flags().StringVar(&r.config, "config", "", "configuration file (keys it names override the defaults)")
	c.Flags().StringArrayVar(&r.sets, "set", nil, "override one key, e.g. --set staging.capacity=2GiB (repeatable)")
	return c
}

// mountRequest is one mount asked for, by `gdsfs mount` or the mount
// helper (helper.go).
type mountRequest struct {
	config             string
	sets               []string
	daemon             bool
	source, mountpoint string
}

// run loads the configuration and mounts, in the foreground or detached.
func (r mountRequest) run() error {
	cfg, err := config.Load(r.config, r.sets)
	if err != nil {
		if inBackground() { // the starter checked it: a file changed since
			return readyFromEnv().fail(usageError{err})
		}
		return usageError{err}
	}
	if r.daemon && !inBackground() {
		return r.background()
	}
	return runMount(cfg, r.source, r.mountpoint)
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
		return ready.fail(usageError{fmt.Errorf("log: %w", err)})
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
		return usageError{err}
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
