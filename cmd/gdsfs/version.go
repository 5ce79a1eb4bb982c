package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/gdsfs/gdsfs/daemon"
)

func versionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print gdsfs, Go and go-fuse versions",
		Args:  exactArgs(),
		RunE: func(cmd *cobra.Command, args []string) error {
			fmt.Print(daemon.VersionText())
			return nil
		},
	}
}
