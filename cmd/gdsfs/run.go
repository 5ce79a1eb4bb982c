package main

import (
	_ "embed"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
)

//go:embed run.md
var runHelp string

func runCmd() *cobra.Command {
	var zeroCopy bool
	c := &cobra.Command{
		Use:   "run [--zero-copy] [--] COMMAND [ARGS...]",
		Short: "Run COMMAND with the autoloader in every Python process it starts",
		Long:  runHelp,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usageError{Err: fmt.Errorf("%s: want COMMAND [ARGS...]", cmd.CommandPath())}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			dir, err := pythonDir(cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			return execWithAutoload(dir, zeroCopy, args)
		},
	}
	c.Flags().SetInterspersed(false) // flags after COMMAND are COMMAND's
	c.Flags().BoolVar(&zeroCopy, "zero-copy", false,
		"hand read-only views of the staged bytes instead of copies (GDSFS_ZERO_COPY=1)")
	return c
}

// execWithAutoload replaces this process with args[0], its environment
// enabling the autoloader from pydir (the directory holding gdsfs/).
func execWithAutoload(pydir string, zeroCopy bool, args []string) error {
	path, err := exec.LookPath(args[0])
	if err != nil {
		return fmt.Errorf("run %s: %w", args[0], err)
	}
	env := autoloadEnv(os.Environ(), pydir, zeroCopy)
	if err := syscall.Exec(path, args, env); err != nil {
		return fmt.Errorf("run %s: %w", path, err)
	}
	return nil
}

// autoloadEnv is env with pydir first on PYTHONPATH and GDSFS_AUTOLOAD=1
// (GDSFS_ZERO_COPY=1 with zeroCopy).
func autoloadEnv(env []string, pydir string, zeroCopy bool) []string {
	pp := pydir
	out := make([]string, 0, len(env)+3)
	for _, kv := range env {
		switch {
		case strings.HasPrefix(kv, "PYTHONPATH="):
			if old := strings.TrimPrefix(kv, "PYTHONPATH="); old != "" {
				pp += string(os.PathListSeparator) + old
			}
		case strings.HasPrefix(kv, "GDSFS_AUTOLOAD="):
		case zeroCopy && strings.HasPrefix(kv, "GDSFS_ZERO_COPY="):
		default:
			out = append(out, kv)
		}
	}
	out = append(out, "PYTHONPATH="+pp, "GDSFS_AUTOLOAD=1")
	if zeroCopy {
		out = append(out, "GDSFS_ZERO_COPY=1")
	}
	return out
}
