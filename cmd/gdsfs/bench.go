package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/gdsfs/gdsfs/internal/bench"
	"github.com/gdsfs/gdsfs/internal/units"
)

// benchCmd is `gdsfs bench`: the flags; internal/bench measures.
func benchCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "bench",
		Short: "Measure gdsfs against baselines taken in the same run",
	}
	c.AddCommand(benchMountCmd(), benchStageCmd(), benchLeaseCmd())
	return c
}

func benchMountCmd() *cobra.Command {
	o := bench.MountOptions{Size: 1 << 30}
	var asJSON bool
	c := &cobra.Command{
		Use:   "mount [--size 1GiB] [--files 10000] [--runs 5] [--dir DIR] [--loopback BINARY] [--json]",
		Short: "Read throughput and stat rate: native vs gdsfs vs go-fuse loopback",
		Long:  bench.MountDoc,
		Args:  exactArgs(),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := o.Validate(); err != nil {
				return usageError{err}
			}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			rep, err := bench.Mount(ctx, o)
			if err != nil {
				return err
			}
			if asJSON {
				return rep.WriteJSON(os.Stdout)
			}
			return rep.WriteText(os.Stdout)
		},
	}
	f := c.Flags()
	f.Var(sizeFlag{&o.Size}, "size", "size of the file read sequentially")
	f.IntVar(&o.Files, "files", 10000, "number of 1 KiB files to lstat")
	f.IntVar(&o.Runs, "runs", 5, "timed passes per measurement; the best is reported")
	f.StringVar(&o.Dir, "dir", "", "work directory, kept afterwards (default: a new directory under /var/tmp, removed at the end)")
	f.StringVar(&o.Loopback, "loopback", "", "go-fuse example/loopback `BINARY` (default: loopback beside this binary, if there)")
	f.BoolVar(&asJSON, "json", false, "print the results as JSON")
	return c
}

func benchStageCmd() *cobra.Command {
	o := bench.StageOptions{Size: 4 << 30}
	var sets []string
	c := &cobra.Command{
		Use:   "stage [--file PATH | --size 4GiB --dir DIR] [--cold] [--peers] [--set key=value]...",
		Short: "Staging throughput of each load path against the H2D copy rate, the disk and peers",
		Long:  bench.StageDoc,
		Args:  exactArgs(),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := o.Validate(); err != nil {
				return usageError{err}
			}
			cfg, err := bench.StageConfig(sets)
			if err != nil {
				return usageError{err}
			}
			return bench.Stage(cfg, o)
		},
	}
	f := c.Flags()
	f.StringVar(&o.File, "file", "", "file to stage (default: a new file of --size in --dir)")
	f.Var(sizeFlag{&o.Size}, "size", "size of the file made when --file is not given")
	f.StringVar(&o.Dir, "dir", "/var/tmp/gdsfs-bench", "directory for the file made (a disk filesystem)")
	f.IntVar(&o.Runs, "runs", 3, "runs per measurement; the best is reported")
	f.BoolVar(&o.Cold, "cold", false, "also measure with the page cache dropped (root)")
	f.BoolVar(&o.Peers, "peers", false, "also measure the Python peers (python3 with torch)")
	f.BoolVar(&o.JSON, "json", false, "print the results as JSON")
	f.StringArrayVar(&sets, "set", nil, "override a config.yaml key")
	return c
}

func benchLeaseCmd() *cobra.Command {
	o := bench.LeaseOptions{Size: 1 << 30}
	c := &cobra.Command{
		Use:   "lease [--size 1GiB] [--runs 20] [--set key=value]...",
		Short: "Time from acquire to a usable pointer or tensor, against re-reading the file",
		Long:  bench.LeaseDoc,
		Args:  exactArgs(),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := o.Validate(); err != nil {
				return usageError{err}
			}
			return bench.Lease(o)
		},
	}
	f := c.Flags()
	f.Var(sizeFlag{&o.Size}, "size", "file size")
	f.IntVar(&o.Runs, "runs", 20, "acquisitions timed; min and median are reported")
	f.StringVar(&o.Dir, "dir", "/var/tmp/gdsfs-bench-lease", "work directory (a disk filesystem)")
	f.StringVar(&o.Python, "python", "", "directory holding the gdsfs Python package (default: python/ beside the binary's directory)")
	f.StringArrayVar(&o.Sets, "set", nil, "config.yaml key for the mount")
	return c
}

// sizeFlag makes a units.Size a pflag value.
type sizeFlag struct{ s *units.Size }

func (f sizeFlag) String() string { return f.s.String() }
func (f sizeFlag) Type() string   { return "size" }
func (f sizeFlag) Set(v string) error {
	s, err := units.ParseSize(v)
	if err == nil {
		*f.s = s
	}
	return err
}
