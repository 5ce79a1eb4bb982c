// Command gdsfs mounts a directory through FUSE, stages opened files into a
// GPU-resident (or host) cache, and shares the staged bytes with consumers.
//
// Invoked as mount.fuse.gdsfs (or mount.gdsfs), or by mount.fuse as
// `gdsfs SOURCE MOUNTPOINT -o OPTIONS`, it is the mount helper of
// `mount -t fuse.gdsfs` and /etc/fstab (helper.go).
package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/gdsfs/gdsfs"
	"github.com/gdsfs/gdsfs/daemon"
)

// usageError marks bad command-line input (exit status 2).
type usageError = daemon.UsageError

func main() {
	if helperArgs(os.Args) {
		exit(runHelper(os.Args))
	}
	exit(rootCmd().Execute())
}

func rootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "gdsfs",
		Short:         "FUSE filesystem that stages opened files into GPU memory and shows how",
		Version:       gdsfs.Version,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetVersionTemplate(daemon.VersionText())
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error { return usageError{Err: err} })
	root.AddCommand(mountCmd(), umountCmd(), statsCmd(), warmupCmd(), checkCmd(), versionCmd(), benchCmd(), runCmd(), manCmd())
	return root
}

// exit ends the process: 0 on success, 2 for bad input, else 1 (or the
// status a detached daemon reported). The error is printed once.
func exit(err error) {
	if err == nil {
		os.Exit(0)
	}
	var re daemon.ReportedError
	if !errors.As(err, &re) || !re.Printed {
		fmt.Fprintf(os.Stderr, "gdsfs: %v\n", err)
	}
	os.Exit(daemon.ExitCode(err))
}

// exactArgs is cobra.ExactArgs with a message naming what is missing.
func exactArgs(names ...string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != len(names) {
			return usageError{Err: fmt.Errorf("%s: want %d arguments (%v), got %d", cmd.CommandPath(), len(names), names, len(args))}
		}
		return nil
	}
}
