package main

import (
	"encoding/json"
	"os"

	"github.com/spf13/cobra"

	"github.com/gdsfs/gdsfs/tools/check"
)

func checkCmd() *cobra.Command {
	var asJSON bool
	dir := check.DefaultDir
	c := &cobra.Command{
		Use:   "check [--json] [--dir DIR]",
		Short: "Report what this machine offers gdsfs: GDS, cuFile, the POSIX path, FUSE",
		Long: `Like gdscheck.py, with a verdict first:

  GDS: ...; cuFile compat: ...; cuFile read path: ...; POSIX path: ...; staging device: ...

then the kernel's FUSE and passthrough support, the CUDA driver and devices,
libcufile, its version, nvidia-fs and cufile.json, the filesystem of --dir
(block device, udev entry, O_DIRECT), and what to change to get the faster
path. "works" is measured: a file in --dir is staged by each load path of
the device staging.device=auto picks and read back. The cuFile read path
(gds, compat (posix) or none) is what cuFile's own statistics counted for
that read. --json prints the same fields as one object.`,
		Args: exactArgs(),
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
