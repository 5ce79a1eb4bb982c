package main

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
)

func runCmd() *cobra.Command {
	var zeroCopy bool
	c := &cobra.Command{
		Use:   "run [--zero-copy] [--] COMMAND [ARGS...]",
		Short: "Run COMMAND with the autoloader in every Python process it starts",
		Long: `Runs COMMAND with gdsfs's autoloader enabled in every Python process it
starts (children and DataLoader workers too): safetensors and torch.load
calls on files under a gdsfs mount are served from leases; anything else
goes to the original function, counted and logged once per reason.

It puts the directory holding the gdsfs Python package and its
sitecustomize first on PYTHONPATH (the sitecustomize it hides still runs)
and sets GDSFS_AUTOLOAD=1. The package comes from $GDSFS_PYTHON_DIR, else
../python or ../share/gdsfs/python beside the binary, else the copy built
into the binary. A directory that anyone but root and the caller could
change (it, anything in it, or a directory above it) is refused with a
line on stderr, and the built-in copy is used. That copy is unpacked once
per version into a directory private to the caller: $XDG_CACHE_HOME/gdsfs,
~/.cache/gdsfs, $XDG_RUNTIME_DIR/gdsfs or $TMPDIR/gdsfs-run-UID, the first that
can be made and is the caller's alone (else a new one under $TMPDIR).
See docs/run.md.`,
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
