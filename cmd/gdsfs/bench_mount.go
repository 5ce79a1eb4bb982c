package main

import (
	"errors"

	"github.com/spf13/cobra"
)

// benchMountCmd is being written; until then it says so.
func benchMountCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "mount",
		Short: "Read throughput and stat rate: native vs gdsfs vs go-fuse loopback",
		RunE: func(cmd *cobra.Command, args []string) error {
			return errors.New("bench mount: not written yet")
		},
	}
}
