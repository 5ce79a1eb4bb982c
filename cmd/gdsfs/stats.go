package main

import (
	"context"
	_ "embed"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/gdsfs/gdsfs/daemon"
)

//go:embed stats.md
var statsHelp string

func statsCmd() *cobra.Command {
	var asJSON, watch bool
	var interval time.Duration
	var count int
	c := &cobra.Command{
		Use:   "stats [--json] [--watch [--interval 1s] [--count N]] PATH",
		Short: "Print the counters of the gdsfs mount holding PATH (its .gdsfs/stats)",
		Long:  statsHelp,
		Args:  exactArgs("PATH"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if watch {
				ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
				defer stop()
				return daemon.WatchStats(ctx, os.Stdout, args[0], interval, count)
			}
			data, err := daemon.Stats(args[0], asJSON)
			if err != nil {
				return err
			}
			_, err = os.Stdout.Write(data)
			return err
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print the JSON object")
	c.Flags().BoolVar(&watch, "watch", false, "print rates every --interval")
	c.Flags().DurationVar(&interval, "interval", time.Second, "time between --watch lines")
	c.Flags().IntVar(&count, "count", 0, "stop --watch after this many lines (0: until interrupted)")
	return c
}
