package main

import (
	_ "embed"

	"github.com/spf13/cobra"

	"github.com/gdsfs/gdsfs/daemon"
)

//go:embed mount.md
var mountHelp string

func mountCmd() *cobra.Command {
	var r daemon.Request
	c := &cobra.Command{
		Use:   "mount [--daemon] [--config FILE] [--set key=value]... SOURCE MOUNTPOINT",
		Short: "Mount SOURCE on MOUNTPOINT (foreground until SIGTERM, or --daemon)",
		Long:  mountHelp,
		Args:  exactArgs("SOURCE", "MOUNTPOINT"),
		RunE: func(cmd *cobra.Command, args []string) error {
			r.Source, r.Mountpoint = args[0], args[1]
			return r.Run()
		},
	}
	c.Flags().BoolVar(&r.Detach, "daemon", false, "detach once mounted; the exit status says whether the mount came up")
	c.Flags().StringVar(&r.Config, "config", "", "configuration file (keys it names override the defaults)")
	c.Flags().StringArrayVar(&r.Sets, "set", nil, "override one key, e.g. --set staging.capacity=2GiB (repeatable)")
	return c
}
