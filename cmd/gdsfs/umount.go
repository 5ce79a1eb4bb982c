package main

import (
	_ "embed"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/gdsfs/gdsfs/daemon"
	"github.com/gdsfs/gdsfs/internal/mountinfo"
)

//go:embed umount.md
var umountHelp string

func umountCmd() *cobra.Command {
	var lazy, ifDead bool
	c := &cobra.Command{
		Use:   "umount [--lazy | --if-dead] MOUNTPOINT",
		Short: "Unmount a gdsfs mount; a busy mount is reported with the processes using it",
		Long:  umountHelp,
		Args:  exactArgs("MOUNTPOINT"),
		RunE: func(cmd *cobra.Command, args []string) error {
			mnt, err := filepath.Abs(args[0])
			if err != nil {
				return err
			}
			if ifDead {
				_, err := daemon.UnmountIfDead(mnt, cmd.ErrOrStderr())
				return err
			}
			return mountinfo.Unmount(mnt, lazy)
		},
	}
	c.Flags().BoolVar(&lazy, "lazy", false, "detach now; the mount goes when its last file closes")
	c.Flags().BoolVar(&ifDead, "if-dead", false, "only a gdsfs mount whose daemon is gone; leave a live one alone")
	c.MarkFlagsMutuallyExclusive("lazy", "if-dead")
	return c
}
