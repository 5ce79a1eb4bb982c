package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"
)

// manCmd writes the man pages (`make install` puts them in man8): one per
// command, from the same help text --help prints.
func manCmd() *cobra.Command {
	var dir string
	c := &cobra.Command{
		Use:    "man --dir DIR",
		Short:  "Write the gdsfs man pages (section 8) into DIR",
		Hidden: true,
		Args:   exactArgs(),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return err
			}
			root := cmd.Root()
			root.DisableAutoGenTag = true
			hdr := &doc.GenManHeader{Title: "GDSFS", Section: "8", Source: "gdsfs " + root.Version, Manual: "gdsfs"}
			if err := doc.GenManTree(root, hdr, dir); err != nil {
				return fmt.Errorf("man pages in %s: %w", dir, err)
			}
			return nil
		},
	}
	c.Flags().StringVar(&dir, "dir", "", "directory for the pages")
	c.MarkFlagRequired("dir")
	return c
}
