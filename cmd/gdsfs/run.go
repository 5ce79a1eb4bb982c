package main

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/gdsfs/gdsfs"
	"github.com/gdsfs/gdsfs/python"
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
and sets GDSFS_AUTOLOAD=1. The Python
package comes from $GDSFS_PYTHON_DIR, else ../python or ../share/gdsfs/python
beside the binary, else the copy embedded in the binary, unpacked once per
version into $XDG_CACHE_HOME/gdsfs (~/.cache/gdsfs).`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usageError{fmt.Errorf("%s: want COMMAND [ARGS...]", cmd.CommandPath())}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			dir, err := pythonDir()
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

// pythonDir finds the directory holding the gdsfs Python package.
func pythonDir() (string, error) {
	if d := os.Getenv("GDSFS_PYTHON_DIR"); d != "" {
		if !hasPackage(d) {
			return "", fmt.Errorf("GDSFS_PYTHON_DIR=%s: no sitecustomize.py and gdsfs/_bootstrap/boot.py there", d)
		}
		return d, nil
	}
	if exe, err := os.Executable(); err == nil {
		if exe, err = filepath.EvalSymlinks(exe); err == nil {
			base := filepath.Dir(filepath.Dir(exe))
			for _, d := range []string{filepath.Join(base, "python"), filepath.Join(base, "share", "gdsfs", "python")} {
				if hasPackage(d) {
					return d, nil
				}
			}
		}
	}
	cache, err := cacheRoot()
	if err != nil {
		return "", err
	}
	return unpackPython(python.Files, cache, gdsfs.Version)
}

func hasPackage(dir string) bool {
	for _, f := range []string{"sitecustomize.py", filepath.Join("gdsfs", "_bootstrap", "boot.py")} {
		st, err := os.Stat(filepath.Join(dir, f))
		if err != nil || !st.Mode().IsRegular() {
			return false
		}
	}
	return true
}

// cacheRoot is $XDG_CACHE_HOME/gdsfs, else ~/.cache/gdsfs, else a per-uid
// directory under the temporary directory.
func cacheRoot() (string, error) {
	if d := os.Getenv("XDG_CACHE_HOME"); filepath.IsAbs(d) {
		return filepath.Join(d, "gdsfs"), nil
	}
	if h, err := os.UserHomeDir(); err == nil && filepath.IsAbs(h) {
		return filepath.Join(h, ".cache", "gdsfs"), nil
	}
	return filepath.Join(os.TempDir(), fmt.Sprintf("gdsfs-%d", os.Getuid())), nil
}

// unpackPython writes files into cache/python-VERSION-HASH (HASH of the
// content, so a "dev" build never reuses another's files) unless it is
// there already, and returns that directory. It is written beside and
// renamed into place, so a concurrent start sees all of it or none.
func unpackPython(files fs.FS, cache, version string) (string, error) {
	sum, err := contentHash(files)
	if err != nil {
		return "", err
	}
	dir := filepath.Join(cache, fmt.Sprintf("python-%s-%s", sanitize(version), sum))
	if hasPackage(dir) {
		return dir, checkOwned(dir)
	}
	if err := os.MkdirAll(cache, 0o700); err != nil {
		return "", fmt.Errorf("unpack the Python package: %w", err)
	}
	if err := checkOwned(cache); err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(cache, ".unpack-")
	if err != nil {
		return "", fmt.Errorf("unpack the Python package: %w", err)
	}
	defer os.RemoveAll(tmp)
	err = fs.WalkDir(files, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		dst := filepath.Join(tmp, filepath.FromSlash(p))
		if d.IsDir() {
			return os.MkdirAll(dst, 0o755)
		}
		b, err := fs.ReadFile(files, p)
		if err != nil {
			return err
		}
		return os.WriteFile(dst, b, 0o644)
	})
	if err != nil {
		return "", fmt.Errorf("unpack the Python package into %s: %w", tmp, err)
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return "", fmt.Errorf("unpack the Python package: %w", err)
	}
	if err := os.Rename(tmp, dir); err != nil && !hasPackage(dir) {
		return "", fmt.Errorf("unpack the Python package into %s: %w", dir, err)
	}
	return dir, nil
}

// checkOwned refuses a cache directory another user could have filled.
func checkOwned(dir string) error {
	st, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("python cache %s: %w", dir, err)
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok || int(sys.Uid) != os.Getuid() || !st.IsDir() || st.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("python cache %s: not a directory of uid %d writable only by it", dir, os.Getuid())
	}
	return nil
}

func contentHash(files fs.FS) (string, error) {
	h := sha256.New()
	err := fs.WalkDir(files, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(files, p)
		if err != nil {
			return err
		}
		fmt.Fprintf(h, "%s\x00%d\x00", p, len(b))
		h.Write(b)
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("hash the embedded Python package: %w", err)
	}
	return hex.EncodeToString(h.Sum(nil))[:12], nil
}

func sanitize(v string) string {
	return strings.Map(func(r rune) rune {
		if r == '/' || r == os.PathSeparator || r < ' ' {
			return '_'
		}
		return r
	}, v)
}
