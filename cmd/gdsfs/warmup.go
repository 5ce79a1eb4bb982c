package main

import (
	_ "embed"
	"errors"
	"time"

	"github.com/spf13/cobra"

	"github.com/gdsfs/gdsfs/daemon"
)

//go:embed warmup.md
var warmupHelp string

func warmupCmd() *cobra.Command {
	var o daemon.WarmupOptions
	var trace, gpus string
	c := &cobra.Command{
		Use:   "warmup [--wait] [--gpus all|0,1|GPU-...] PATH... | warmup --trace FILE [--wait] [MOUNTPOINT]",
		Short: "Stage files (directories: every file under them) of a gdsfs mount",
		Long:  warmupHelp,
		Args: func(cmd *cobra.Command, args []string) error {
			switch {
			case trace != "" && len(args) > 1:
				return usageError{Err: errors.New("warmup --trace FILE: at most one MOUNTPOINT")}
			case trace == "" && len(args) == 0:
				return usageError{Err: errors.New("warmup: want at least one PATH under a gdsfs mount")}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if trace != "" {
				if cmd.Flags().Changed("gpus") {
					return usageError{Err: errors.New("warmup: --trace and --gpus do not go together")}
				}
				var mnt string
				if len(args) == 1 {
					mnt = args[0]
				}
				return daemon.WarmupTrace(trace, mnt, o.Wait, o.Timeout)
			}
			if cmd.Flags().Changed("gpus") {
				var err error
				if o.GPUs, err = daemon.ParseGPUs(gpus); err != nil {
					return err
				}
			}
			return daemon.Warmup(args, o)
		},
	}
	c.Flags().BoolVar(&o.Wait, "wait", false, "wait until every file is resident or failed")
	c.Flags().DurationVar(&o.Timeout, "timeout", 10*time.Minute, "longest --wait waits")
	c.Flags().StringVar(&trace, "trace", "", "stage the paths of this trace file in its order (.gdsfs/replay)")
	c.Flags().StringVar(&gpus, "gpus", "", "stage a replica on each of these devices: all, or ordinals / names, comma separated")
	return c
}
