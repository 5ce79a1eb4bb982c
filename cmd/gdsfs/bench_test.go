package main

import (
	"io"
	"reflect"
	"strings"
	"testing"

	"github.com/gdsfs/gdsfs/daemon"
	"github.com/gdsfs/gdsfs/internal/units"
)

func TestSizeListFlag(t *testing.T) {
	sizes := []units.Size{1 << 20}
	f := sizeListFlag{&sizes}
	if f.String() != (units.Size(1 << 20)).String() {
		t.Errorf("default shown as %q", f.String())
	}
	if err := f.Set("2MiB, 4MiB,1GiB"); err != nil {
		t.Fatal(err)
	}
	if want := []units.Size{2 << 20, 4 << 20, 1 << 30}; !reflect.DeepEqual(sizes, want) {
		t.Fatalf("got %v, want %v", sizes, want)
	}
	if err := f.Set("2MiB,lots"); err == nil || !strings.Contains(err.Error(), "lots") {
		t.Fatalf("bad size: %v", err)
	}
}

// Every bench subcommand is there with the flags bench-gpu.sh passes.
func TestBenchFlags(t *testing.T) {
	for _, tc := range []struct {
		sub  string
		args []string
	}{
		{"stage", []string{"--size", "4GiB", "--rounds", "2", "--runs", "3", "--quick", "--peers", "--kvikio", "/bin/true",
			"--kvikio-threads", "8,16", "--kvikio-tasks", "2MiB,4MiB", "--dir", "/tmp", "--report", "/tmp/r", "--set", "staging.device=host"}},
		{"lease", []string{"--sizes", "1MiB,32MiB,1GiB", "--runs", "30", "--first", "30", "--dir", "/tmp", "--report", "/tmp/r"}},
		{"loader", []string{"--shards", "64", "--shard-size", "32MiB", "--files", "1024", "--file-size", "1MiB", "--big", "4GiB",
			"--epochs", "3", "--runs", "3", "--workers", "8"}},
		{"contention", []string{"--consumers", "16", "--files", "8", "--file-size", "256MiB", "--capacity", "800MiB"}},
		{"autoload", []string{"--quick", "--dir", "/tmp", "--set", "staging.device=host"}},
		{"readahead", []string{"--quick", "--script", "x.py"}},
	} {
		var found bool
		for _, c := range benchCmd().Commands() {
			if c.Name() != tc.sub {
				continue
			}
			found = true
			if err := c.ParseFlags(tc.args); err != nil {
				t.Errorf("bench %s %v: %v", tc.sub, tc.args, err)
			}
		}
		if !found {
			t.Errorf("no bench %s", tc.sub)
		}
	}
}

// Each row makes a documented subcommand; options a row's check refuses
// are bad input (exit status 2), reported before anything is measured.
func TestBenchRows(t *testing.T) {
	for _, c := range benchCmd().Commands() {
		if !c.Hidden && (c.Short == "" || c.Long == "") {
			t.Errorf("bench %s: no help (Short %q, %d bytes of Long)", c.Name(), c.Short, len(c.Long))
		}
	}
	root := rootCmd()
	root.SetArgs([]string{"bench", "mount", "--size", "1KiB"})
	root.SetOut(io.Discard)
	err := root.Execute()
	if code := daemon.ExitCode(err); code != 2 || err == nil || !strings.Contains(err.Error(), "--size") {
		t.Fatalf("bench mount --size 1KiB: %v (exit %d), want a usage error naming --size", err, code)
	}
}
