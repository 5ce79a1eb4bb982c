package main

import (
	_ "embed"
	"encoding/json"
	"os"

	"github.com/spf13/cobra"

	"github.com/gdsfs/gdsfs/tools/check"
)

//go:embed check.md
var checkHelp string

func checkCmd() *cobra.Command {
	var asJSON bool
	dir := check.DefaultDir
	c := &cobra.Command{
		Use:   "check [--json] [--dir DIR]",
		Short: "Report what this machine offers gdsfs: GDS, cuFile, the POSIX path, FUSE",
		Long:  checkHelp,
		Args:  exactArgs(),
		RunE: func(cmd *cobra.Command, args []string) error {
			r := check.Run(dir)
			if asJSON {
				enc := json.NewEncoder(os.Stdout)
				enc.SetIndent("", "  ")
				enc.SetEscapeHTML(false)
				return enc.Encode(r)
			}
			return r.WriteText(os.Stdout)
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	c.Flags().StringVar(&dir, "dir", dir, "directory to probe the load paths in (where your data lives)")
	return c
}
