package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/gdsfs/gdsfs/internal/units"
	"github.com/gdsfs/gdsfs/tools/bench"
)

// benchRow is one `gdsfs bench` subcommand: its help, the flags bound to
// its options, the check of those options (a failure is bad input, exit
// status 2), and the run, which ends on SIGINT or SIGTERM.
type benchRow struct {
	use, short, long string
	hidden           bool
	args             cobra.PositionalArgs // nil: no arguments
	flags            func(f *pflag.FlagSet)
	validate         func() error // nil: nothing to check
	run              func(ctx context.Context, args []string) error
}

// benchCmd is `gdsfs bench`: one subcommand per row of benchRows;
// tools/bench measures.
func benchCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "bench",
		Short: "Measure gdsfs against baselines taken in the same run",
	}
	for _, r := range benchRows() {
		c.AddCommand(r.command())
	}
	return c
}

func (r benchRow) command() *cobra.Command {
	c := &cobra.Command{
		Use: r.use, Short: r.short, Long: r.long, Hidden: r.hidden, Args: r.args,
		RunE: func(cmd *cobra.Command, args []string) error {
			if r.validate != nil {
				if err := r.validate(); err != nil {
					return usageError{Err: err}
				}
			}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return r.run(ctx, args)
		},
	}
	if c.Args == nil {
		c.Args = exactArgs()
	}
	if r.flags != nil {
		r.flags(c.Flags())
	}
	return c
}

// benchRows are the subcommands of `gdsfs bench`, each with its own
// options.
func benchRows() []benchRow {
	return []benchRow{benchMount(), benchStage(), benchLease(), benchLeaseChild(), benchLoader(),
		benchContention(), benchMultiGPU(), benchScript("autoload"), benchScript("readahead"), benchAutoloadOverhead()}
}

func benchMount() benchRow {
	o := bench.MountOptions{Size: 1 << 30, MetaFiles: 100000}
	var asJSON bool
	return benchRow{
		use:   "mount [--size 1GiB] [--files 10000] [--meta-files 100000] [--runs 5] [--dir DIR] [--loopback BINARY] [--json]",
		short: "Read throughput and stat rate: native vs gdsfs vs go-fuse loopback",
		long:  bench.MountDoc,
		flags: func(f *pflag.FlagSet) {
			f.Var(sizeFlag{&o.Size}, "size", "size of the file read sequentially")
			f.IntVar(&o.Files, "files", 10000, "number of 1 KiB files to lstat")
			f.IntVar(&o.MetaFiles, "meta-files", o.MetaFiles, "files in the tree find and ls -lR walk (0: not measured)")
			f.IntVar(&o.Runs, "runs", 5, "timed passes per measurement; the best is reported")
			f.StringVar(&o.Dir, "dir", "", "work directory, kept afterwards (default: a new directory under /var/tmp, removed at the end)")
			f.StringVar(&o.Loopback, "loopback", "", "go-fuse example/loopback `BINARY` (default: loopback beside this binary, if there)")
			f.BoolVar(&asJSON, "json", false, "print the results as JSON")
		},
		validate: o.Validate,
		run: func(ctx context.Context, _ []string) error {
			rep, err := bench.Mount(ctx, o)
			if err != nil {
				return err
			}
			if asJSON {
				err = rep.WriteJSON(os.Stdout)
			} else {
				err = rep.WriteText(os.Stdout)
			}
			if err != nil {
				return err
			}
			return rep.Verdict()
		},
	}
}

func benchStage() benchRow {
	o := bench.StageOptions{Size: 4 << 30}
	var sets []string
	tasks := []units.Size{2 << 20, 4 << 20, 8 << 20}
	return benchRow{
		use:   "stage [--file PATH | --size 4GiB --dir DIR] [--cold] [--peers] [--kvikio BINARY] [--rounds N] [--quick] [--set key=value]...",
		short: "Staging throughput against the H2D copy rate, the disk, KvikIO and the Python peers",
		long:  bench.StageDoc,
		flags: func(f *pflag.FlagSet) {
			f.StringVar(&o.File, "file", "", "file to stage (default: a new file of --size in --dir)")
			f.Var(sizeFlag{&o.Size}, "size", "size of the file made when --file is not given")
			f.StringVar(&o.Dir, "dir", "/var/tmp/gdsfs-bench/files", "directory for the file made (a disk filesystem)")
			f.IntVar(&o.Runs, "runs", 3, "runs per measurement; the best is reported")
			f.IntVar(&o.Rounds, "rounds", 1, "rounds interleaving the H2D copy, gdsfs's defaults and the KvikIO sweep")
			f.BoolVar(&o.Cold, "cold", false, "also measure with the page cache dropped (root)")
			f.BoolVar(&o.Peers, "peers", false, "also measure the Python peers (python3 with torch)")
			f.BoolVar(&o.Quick, "quick", false, "skip the explicit POSIX row, the Python peers and, without --cold, the disk baselines")
			f.StringVar(&o.Kvik.Bin, "kvikio", "", "KvikIO reader `BINARY` (kvikbench, from ../shared/peers/kvikio/build.sh)")
			f.IntSliceVar(&o.Kvik.Threads, "kvikio-threads", []int{8, 16, 24, 32}, "KVIKIO_NTHREADS values swept")
			f.Var(sizeListFlag{&tasks}, "kvikio-tasks", "KVIKIO_TASK_SIZE values swept")
			f.IntVar(&o.Kvik.Runs, "kvikio-runs", 3, "kvikbench runs per setting (it reports the best)")
			f.DurationVar(&o.Kvik.Budget, "kvikio-budget", 90*time.Second, "after this much sweeping, later rounds run only the 3 best settings")
			f.DurationVar(&o.Kvik.Limit, "kvikio-limit", 2*time.Minute, "limit for one kvikbench run")
			f.BoolVar(&o.JSON, "json", false, "print the results as JSON")
			f.StringVar(&o.Report, "report", "", "also append the results as one JSON line to `FILE`")
			f.StringArrayVar(&sets, "set", nil, "override a config.yaml key")
		},
		validate: func() error {
			for _, t := range tasks {
				o.Kvik.Tasks = append(o.Kvik.Tasks, int64(t))
			}
			return o.Validate()
		},
		run: func(ctx context.Context, _ []string) error {
			cfg, err := bench.StageConfig(sets)
			if err != nil {
				return usageError{Err: err}
			}
			return bench.Stage(ctx, cfg, o)
		},
	}
}

func benchLease() benchRow {
	o := bench.LeaseOptions{}
	sizes := []units.Size{1 << 20, 32 << 20, 1 << 30}
	return benchRow{
		use:   "lease [--sizes 1MiB,32MiB,1GiB] [--runs 30] [--first 30] [--set key=value]...",
		short: "First and repeat lease of resident files, Go and Python, against the raw import-and-map floor",
		long:  bench.LeaseDoc,
		flags: func(f *pflag.FlagSet) {
			f.Var(sizeListFlag{&sizes}, "sizes", "sizes of the resident files leased")
			f.IntVar(&o.Runs, "runs", 30, "repeat leases (and floor cycles) timed per size; the median is reported")
			f.IntVar(&o.First, "first", 30, "processes each timing one first lease per size")
			commonFlags(f, &o.Dir, &o.Py, &o.Sets, &o.JSON, &o.Report)
		},
		validate: func() error {
			o.Sizes = sizes
			return o.Validate()
		},
		run: func(ctx context.Context, _ []string) error { return bench.Lease(ctx, o) },
	}
}

// benchLeaseChild is the Go process of `bench lease` timing first leases.
func benchLeaseChild() benchRow {
	var warm string
	return benchRow{
		use:    "lease-child --warm PATH PATH...",
		hidden: true,
		args:   cobra.MinimumNArgs(1),
		flags:  func(f *pflag.FlagSet) { f.StringVar(&warm, "warm", "", "file leased first, untimed") },
		run: func(_ context.Context, args []string) error {
			return bench.LeaseChild(os.Stdout, warm, args)
		},
	}
}

func benchLoader() benchRow {
	o := bench.LoaderOptions{Shards: 64, ShardSize: 32 << 20, Files: 1024, FileSize: 1 << 20, Big: 4 << 30}
	return benchRow{
		use:   "loader [--shards 64 --shard-size 32MiB] [--files 1024 --file-size 1MiB] [--big 4GiB] [--epochs 3]",
		short: "DataLoader epochs over resident files with leases vs read() through the mount; gdsfs.load of a file not yet resident vs the H2D copy",
		long:  bench.LoaderDoc,
		flags: func(f *pflag.FlagSet) {
			f.IntVar(&o.Shards, "shards", o.Shards, "number of shards (0: no shard epoch)")
			f.Var(sizeFlag{&o.ShardSize}, "shard-size", "size of a shard")
			f.IntVar(&o.Files, "files", o.Files, "number of small files (0: no small-file epoch)")
			f.Var(sizeFlag{&o.FileSize}, "file-size", "size of a small file")
			f.Var(sizeFlag{&o.Big}, "big", "size of the file loaded while not yet resident (0: skip)")
			f.IntVar(&o.Epochs, "epochs", 3, "epochs per loader; the first and the best are reported")
			f.IntVar(&o.Runs, "runs", 3, "gdsfs.load runs of the big file and H2D copies; the best is reported")
			f.IntVar(&o.Workers, "workers", 4, "DataLoader workers of the read() epochs")
			f.IntVar(&o.Ahead, "ahead", 16, "files leased ahead by gdsfs.torch's helper, where the client has it")
			commonFlags(f, &o.Dir, &o.Py, &o.Sets, &o.JSON, &o.Report)
		},
		validate: func() error { return o.Validate() },
		run:      func(ctx context.Context, _ []string) error { return bench.Loader(ctx, o) },
	}
}

func benchContention() benchRow {
	o := bench.ContentionOptions{Consumers: 16, Files: 8, FileSize: 256 << 20, Capacity: 800 << 20}
	return benchRow{
		use:   "contention [--consumers 16] [--files 8] [--file-size 256MiB] [--capacity 800MiB]",
		short: "Consumer processes leasing more than the capacity holds: every acquire, every sha256, leases and daemon resources after",
		long:  bench.ContentionDoc,
		flags: func(f *pflag.FlagSet) {
			f.IntVar(&o.Consumers, "consumers", o.Consumers, "consumer processes")
			f.IntVar(&o.Files, "files", o.Files, "files each consumer leases, one at a time, in its own random order")
			f.Var(sizeFlag{&o.FileSize}, "file-size", "size of each file")
			f.Var(sizeFlag{&o.Capacity}, "capacity", "staging.capacity of the mount")
			commonFlags(f, &o.Dir, &o.Py, &o.Sets, &o.JSON, &o.Report)
		},
		validate: func() error { return o.Validate() },
		run:      func(ctx context.Context, _ []string) error { return bench.Contention(ctx, o) },
	}
}

func benchMultiGPU() benchRow {
	o := bench.MultiGPUOptions{Size: 8 << 30, Consumers: true}
	return benchRow{
		use:   "multigpu [--size 8GiB] [--dir /dev/shm/gdsfs-multigpu] [--runs 3] [--consumers=false] [--set key=value]...",
		short: "Two GPUs: peer copy and H2D baselines, split ingest vs staging twice, two files at once, consumers on each GPU",
		long:  bench.MultiGPUDoc,
		flags: func(f *pflag.FlagSet) {
			f.Var(sizeFlag{&o.Size}, "size", "size of each of the two files")
			f.StringVar(&o.Dir, "dir", "/dev/shm/gdsfs-multigpu", "directory for the two files (memory, or a disk whose pages stay cached); kept")
			f.StringVar(&o.Work, "work", "/var/tmp/gdsfs-multigpu", "directory for the mount, its socket and log, and the Python helper")
			f.IntVar(&o.Runs, "runs", 3, "runs per measurement; the shortest is reported")
			f.BoolVar(&o.Consumers, "consumers", true, "also mount --dir and run the consumer checks (root)")
			pythonFlags(f, &o.Py)
			f.StringArrayVar(&o.Sets, "set", nil, "config.yaml key, for the measurements and the mount (staging.device=host, staging.host_devices=2)")
			f.BoolVar(&o.JSON, "json", false, "print the results as JSON")
			f.StringVar(&o.Report, "report", "", "also append the results as one JSON line to `FILE`")
		},
		validate: func() error { return o.Validate() },
		run: func(ctx context.Context, _ []string) error {
			cfg, err := bench.MultiGPUConfig(o.Sets)
			if err != nil {
				return usageError{Err: err}
			}
			return bench.MultiGPU(ctx, cfg, o)
		},
	}
}

// benchScript is `gdsfs bench autoload` or `gdsfs bench readahead`: the
// embedded script (or --script), its flags after --.
func benchScript(name string) benchRow {
	o := bench.ScriptOptions{Name: name}
	return benchRow{
		use:   name + " [--script FILE] [--quick] [--dir DIR] [-- SCRIPT FLAGS...]",
		short: bench.ScriptShort(name),
		long:  bench.ScriptDoc(name),
		args:  cobra.ArbitraryArgs,
		flags: func(f *pflag.FlagSet) {
			f.StringVar(&o.Script, "script", "", "run this script instead of the embedded one")
			f.BoolVar(&o.Quick, "quick", false, "small sizes and one repetition")
			f.BoolVar(&o.Force, "force", false, "autoload: run all of it (GPU loads) even where the mount would stage on the host backend (else its dry run)")
			f.StringVar(&o.Dir, "dir", "/var/tmp/gdsfs-bench", "work directory (a disk filesystem)")
			pythonFlags(f, &o.Py)
			f.StringArrayVar(&o.Sets, "set", nil, "config.yaml key for the script's mount; staging.device=host also picks the host run")
		},
		run: func(ctx context.Context, args []string) error {
			o.Args = args
			return bench.Script(ctx, o)
		},
	}
}

// commonFlags are the flags of the benchmarks that mount a work
// directory and run Python consumers.
func commonFlags(f *pflag.FlagSet, dir *string, py *bench.PyFlags, sets *[]string, asJSON *bool, report *string) {
	f.StringVar(dir, "dir", "/var/tmp/gdsfs-bench", "work directory on a disk filesystem (files in DIR/files, kept)")
	pythonFlags(f, py)
	f.StringArrayVar(sets, "set", nil, "config.yaml key for the mount")
	f.BoolVar(asJSON, "json", false, "print the results as JSON")
	f.StringVar(report, "report", "", "also append the results as one JSON line to `FILE`")
}

func pythonFlags(f *pflag.FlagSet, py *bench.PyFlags) {
	f.StringVar(&py.Bin, "python-bin", "", "Python interpreter (default: python3, or /usr/bin/python3 where only it has torch)")
	f.StringVar(&py.Pkg, "python", "", "directory holding the gdsfs Python package (default: python/ beside the binary's directory)")
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

// sizeListFlag is a comma-separated list of sizes; setting it replaces
// the default.
type sizeListFlag struct{ s *[]units.Size }

func (f sizeListFlag) String() string {
	if f.s == nil {
		return ""
	}
	var parts []string
	for _, s := range *f.s {
		parts = append(parts, s.String())
	}
	return strings.Join(parts, ",")
}

func (f sizeListFlag) Type() string { return "sizes" }

func (f sizeListFlag) Set(v string) error {
	var out []units.Size
	for _, p := range strings.Split(v, ",") {
		s, err := units.ParseSize(strings.TrimSpace(p))
		if err != nil {
			return fmt.Errorf("%q: %w", p, err)
		}
		out = append(out, s)
	}
	*f.s = out
	return nil
}

func benchAutoloadOverhead() benchRow {
	o := bench.AutoloadOverheadOptions{Calls: 20000, Rounds: 15}
	return benchRow{
		use:   "autoload-overhead [--calls 20000] [--rounds 15]",
		short: "What the autoloader adds to a tensor move not from a mount (target 2 us)",
		long:  bench.AutoloadOverheadDoc,
		flags: func(f *pflag.FlagSet) {
			f.IntVar(&o.Calls, "calls", o.Calls, "calls per timed round")
			f.IntVar(&o.Rounds, "rounds", o.Rounds, "rounds of each call, plain and wrapped alternating")
			commonFlags(f, &o.Dir, &o.Py, &o.Sets, &o.JSON, &o.Report)
		},
		validate: o.Validate,
		run:      func(ctx context.Context, _ []string) error { return bench.AutoloadOverhead(ctx, o) },
	}
}
