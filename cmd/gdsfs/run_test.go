package main

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"testing/fstest"

	"github.com/gdsfs/gdsfs/python"
)

func TestAutoloadEnv(t *testing.T) {
	env := []string{"A=1", "PYTHONPATH=/old", "GDSFS_AUTOLOAD=0", "GDSFS_ZERO_COPY=0"}
	got := autoloadEnv(env, "/py", true)
	want := []string{"A=1", "PYTHONPATH=/py:/old", "GDSFS_AUTOLOAD=1", "GDSFS_ZERO_COPY=1"}
	if !slices.Equal(got, want) {
		t.Fatalf("autoloadEnv = %q, want %q", got, want)
	}
	got = autoloadEnv([]string{"PYTHONPATH=", "GDSFS_ZERO_COPY=1"}, "/py", false)
	want = []string{"GDSFS_ZERO_COPY=1", "PYTHONPATH=/py", "GDSFS_AUTOLOAD=1"}
	if !slices.Equal(got, want) {
		t.Fatalf("autoloadEnv = %q, want %q", got, want)
	}
}

func TestUnpackPythonEmbedded(t *testing.T) {
	cache := filepath.Join(t.TempDir(), "cache")
	dir, err := unpackPython(python.Files, cache, "v1/x")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"sitecustomize.py", "gdsfs/__init__.py", "gdsfs/_lease.py", "gdsfs/autoload/__init__.py",
		"gdsfs/_bootstrap/boot.py"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("unpacked package lacks %s: %v", f, err)
		}
	}
	if filepath.Base(dir)[:len("python-v1_x-")] != "python-v1_x-" {
		t.Errorf("cache directory %s is not keyed by the version", dir)
	}
	again, err := unpackPython(python.Files, cache, "v1/x")
	if err != nil || again != dir {
		t.Fatalf("second unpack = %q, %v; want %q", again, err, dir)
	}
	other, err := unpackPython(fstest.MapFS{"sitecustomize.py": {Data: []byte("x")},
		"gdsfs/_bootstrap/boot.py": {Data: []byte("x")}}, cache, "v1/x")
	if err != nil || other == dir {
		t.Fatalf("different content unpacked to %q (%v); want a directory other than %q", other, err, dir)
	}
}

func TestUnpackPythonRefusesSharedCache(t *testing.T) {
	cache := filepath.Join(t.TempDir(), "cache")
	if err := os.MkdirAll(cache, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(cache, 0o777); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []os.FileMode{0o777, 0o755} {
		if err := os.Chmod(cache, mode); err != nil {
			t.Fatal(err)
		}
		if _, err := unpackPython(python.Files, cache, "v1"); err == nil {
			t.Fatalf("unpacked into a cache directory of mode %04o", mode)
		}
	}
}
