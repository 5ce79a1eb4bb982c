package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"github.com/gdsfs/gdsfs/fs"
	"github.com/gdsfs/gdsfs/gpu"
	"github.com/gdsfs/gdsfs/internal/config"
	"github.com/gdsfs/gdsfs/internal/mountinfo"
	"github.com/gdsfs/gdsfs/ipc"
	"github.com/gdsfs/gdsfs/staging"
)

func mountCmd() *cobra.Command {
	var file string
	var sets []string
	c := &cobra.Command{
		Use:   "mount [--config FILE] [--set key=value]... SOURCE MOUNTPOINT",
		Short: "Mount SOURCE on MOUNTPOINT (foreground; SIGINT/SIGTERM unmount)",
		Args:  exactArgs("SOURCE", "MOUNTPOINT"),
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, err := config.Load(file, sets)
			if err != nil {
				return usageError{err}
			}
			return runMount(cfg, args[0], args[1])
		},
	}
	c.Flags().StringVar(&file, "config", "", "configuration file (keys it names override the defaults)")
	c.Flags().StringArrayVar(&sets, "set", nil, "override one key, e.g. --set staging.capacity=2GiB (repeatable)")
	return c
}

// daemon is one mount with its cache and lease server.
type daemon struct {
	cfg     *config.Config
	log     *zap.Logger
	devs    []gpu.Device
	cache   *staging.Cache
	ipc     *ipc.Server
	fs      *fs.Server
	version string
}

func runMount(cfg *config.Config, source, mnt string) error {
	log, err := newLogger(cfg.Log)
	if err != nil {
		return usageError{fmt.Errorf("log.level: %w", err)}
	}
	defer log.Sync()
	d := &daemon{cfg: cfg, log: log}
	// Signals that arrive while starting are handled once mounted.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	if err := d.start(source, mnt); err != nil {
		d.stop()
		return err
	}
	log.Info("mounted", zap.String("source", source), zap.String("mountpoint", d.fs.Mountpoint()),
		zap.String("device", d.devs[0].Name()), zap.Bool("passthrough", d.fs.Stats().Passthrough),
		zap.String("socket", d.ipc.Path()))
	go d.ipc.Serve()
	go d.unmountOnSignal(sigs)
	d.fs.Wait()
	log.Info("unmounted", zap.String("mountpoint", d.fs.Mountpoint()))
	d.stop()
	return nil
}

func (d *daemon) start(source, mnt string) error {
	cfg := d.cfg
	source, absMnt, err := fs.CheckPaths(source, mnt)
	if err != nil {
		return usageError{err}
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
	d.ipc, err = ipc.Listen(ipc.Config{Source: source, Mountpoint: absMnt, Options: cfg.IPC, Cache: d.cache, Log: d.log})
	if err != nil {
		return err
	}
	d.fs, err = fs.Mount(fs.Config{
		Source: source, Mountpoint: mnt, Options: cfg.FUSE, Stager: d.cache,
		Controls: d.controls, Log: d.log,
	})
	return err
}

// stop releases what start made, in reverse order.
func (d *daemon) stop() {
	if d.ipc != nil {
		d.ipc.Close()
	}
	if d.cache != nil {
		d.cache.Close()
	}
	closeDevices(d.devs)
}

// unmountOnSignal unmounts on SIGINT or SIGTERM. A busy mount stays
// mounted and served, and the log says who holds it.
func (d *daemon) unmountOnSignal(sigs <-chan os.Signal) {
	for sig := range sigs {
		d.log.Info("unmounting", zap.String("signal", sig.String()))
		if err := d.fs.Unmount(); err != nil {
			d.log.Error("cannot unmount; still serving", zap.Error(mountinfo.Busy(d.fs.Mountpoint())), zap.NamedError("cause", err))
		}
	}
}
