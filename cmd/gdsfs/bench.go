package main

import "github.com/spf13/cobra"

func benchCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "bench",
		Short: "Measure gdsfs against baselines taken in the same run",
	}
	c.AddCommand(benchMountCmd(), benchStageCmd(), benchLeaseCmd())
	return c
}
