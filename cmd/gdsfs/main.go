// Command gdsfs mounts a directory through FUSE, stages opened files into a
// GPU-resident (or host) cache, and shares the staged bytes with consumers.
package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"
)

// usageError marks bad command-line input (exit status 2).
type usageError struct{ error }

func main() {
	root := &cobra.Command{
		Use:           "gdsfs",
		Short:         "FUSE filesystem that stages opened files into GPU memory and shows how",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error { return usageError{err} })
	root.AddCommand(mountCmd(), umountCmd(), statsCmd(), warmupCmd(), checkCmd(), versionCmd(), benchCmd(), runCmd())
	if err := root.Execute(); err != nil {
		fmt.Fprintf(os.Stderr, "gdsfs: %v\n", err)
		var ue usageError
		if errors.As(err, &ue) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

// exactArgs is cobra.ExactArgs with a message naming what is missing.
func exactArgs(names ...string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != len(names) {
			return usageError{fmt.Errorf("%s: want %d arguments (%v), got %d", cmd.CommandPath(), len(names), names, len(args))}
		}
		return nil
	}
}
