package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
)

func statsCmd() *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "stats [--json] MOUNTPOINT",
		Short: "Print a mount's counters (MOUNTPOINT/.gdsfs/stats)",
		Args:  exactArgs("MOUNTPOINT"),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := "stats"
			if asJSON {
				name = "stats.json"
			}
			data, err := os.ReadFile(filepath.Join(args[0], ".gdsfs", name))
			if err != nil {
				return fmt.Errorf("%s: not a gdsfs mount? %w", args[0], err)
			}
			_, err = os.Stdout.Write(data)
			return err
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print the JSON object")
	return c
}
