package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
)

// benchWorkDir is a bench work directory that uid 65534 made before
// root's bench ran (as it can make /var/tmp/gdsfs-bench, the default).
func benchWorkDir(t *testing.T) string {
	t.Helper()
	d := filepath.Join(userDir(t), "gdsfs-bench")
	if err := os.Mkdir(d, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(d, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	return d
}

// plant makes path (and its missing parents under dir) owned by uid
// 65534: a file with body, or a symbolic link to target when body is "".
func plant(t *testing.T, dir, path, body, target string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	for q := filepath.Dir(path); q != dir && q != "/"; q = filepath.Dir(q) {
		if err := os.Chown(q, nobody, nobody); err != nil {
			t.Fatal(err)
		}
	}
	var err error
	if target != "" {
		err = os.Symlink(target, path)
	} else {
		err = os.WriteFile(path, []byte(body), 0o644)
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(path, nobody, nobody); err != nil {
		t.Fatal(err)
	}
}

// TestBenchWorkDirOfAnotherUser: a bench run as root in a work directory
// another user made never writes through that user's symbolic links nor
// runs that user's Python modules (it may refuse the directory).
func TestBenchWorkDirOfAnotherUser(t *testing.T) {
	needMount(t)
	t.Run("stage does not write through a planted link", func(t *testing.T) {
		dir := benchWorkDir(t)
		victim := filepath.Join(t.TempDir(), "root-only")
		if err := os.WriteFile(victim, []byte("root's file\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		plant(t, dir, filepath.Join(dir, "bench-1048576.bin"), "", victim)
		out, _ := exec.Command(bins.gdsfs, "bench", "stage", "--size", "1MiB", "--dir", dir, "--quick",
			"--runs", "1", "--set", "staging.device=host").CombinedOutput()
		if b, err := os.ReadFile(victim); err != nil || string(b) != "root's file\n" {
			t.Errorf("root's %s was rewritten through uid %d's link (%d bytes now, %v)\n%s", victim, nobody, len(b), err, out)
		}
	})
	t.Run("lease does not write its daemon's log through a planted link", func(t *testing.T) {
		dir := benchWorkDir(t)
		victim := filepath.Join(t.TempDir(), "root-only")
		if err := os.WriteFile(victim, []byte("root's file\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		plant(t, dir, filepath.Join(dir, "lease.log"), "", victim)
		out, _ := exec.Command(bins.gdsfs, "bench", "lease", "--dir", dir, "--sizes", "1MiB", "--runs", "1", "--first", "1",
			"--python", "../python", "--set", "staging.device=host").CombinedOutput()
		if b, err := os.ReadFile(victim); err != nil || string(b) != "root's file\n" {
			t.Errorf("root's %s was rewritten through uid %d's link (%d bytes now, %v)\n%s", victim, nobody, len(b), err, out)
		}
	})
	t.Run("autoload does not import a planted module", func(t *testing.T) {
		dir := benchWorkDir(t)
		marker := filepath.Join(t.TempDir(), "ran")
		mod := "import os\nopen(" + strconv.Quote(marker) + ", 'w').write(str(os.getuid()))\nraise SystemExit(3)\n"
		for _, name := range []string{"argparse.py", "hashlib.py", "json.py"} {
			plant(t, dir, filepath.Join(dir, "py", "repo", "scripts", name), mod, "")
		}
		out, _ := exec.Command(bins.gdsfs, "bench", "autoload", "--dir", dir, "--python", "../python",
			"--set", "staging.device=host").CombinedOutput()
		if b, err := os.ReadFile(marker); err == nil {
			t.Errorf("root imported uid %d's module from %s (it ran as uid %s)\n%s", nobody, dir, b, out)
		}
	})
}
