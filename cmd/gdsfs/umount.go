package main

import (
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/gdsfs/gdsfs/internal/mountinfo"
)

func umountCmd() *cobra.Command {
	var lazy bool
	c := &cobra.Command{
		Use:   "umount MOUNTPOINT",
		Short: "Unmount a gdsfs mount; a busy mount is reported with the processes using it",
		Args:  exactArgs("MOUNTPOINT"),
		RunE: func(cmd *cobra.Command, args []string) error {
			mnt, err := filepath.Abs(args[0])
			if err != nil {
				return err
			}
			return mountinfo.Unmount(mnt, lazy)
		},
	}
	c.Flags().BoolVar(&lazy, "lazy", false, "detach now; the mount goes when its last file closes")
	return c
}
