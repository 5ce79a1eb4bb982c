package gdsfs

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestVersionIsThePythonPackages: the binary's release is the Python
// package's VERSION file, which the wheel's metadata reads too
// (python/pyproject.toml), and it is a plain release number both Go and
// Python's packaging accept.
func TestVersionIsThePythonPackages(t *testing.T) {
	b, err := os.ReadFile("python/gdsfs/VERSION")
	if err != nil {
		t.Fatal(err)
	}
	file := strings.TrimSpace(string(b))
	if !regexp.MustCompile(`^[0-9]+\.[0-9]+\.[0-9]+$`).MatchString(file) {
		t.Fatalf("python/gdsfs/VERSION holds %q, want N.N.N", file)
	}
	if Release() != file || !strings.HasPrefix(Version, file) {
		t.Fatalf("Release() %q, Version %q; python/gdsfs/VERSION says %q", Release(), Version, file)
	}
	py, err := os.ReadFile("python/pyproject.toml")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(py), `version = { file = "gdsfs/VERSION" }`) {
		t.Fatal("python/pyproject.toml does not take its version from gdsfs/VERSION")
	}
	for _, tc := range []struct{ release, build, want string }{
		{"0.2.0\n", "", "0.2.0"},
		{"0.2.0\n", "c40264d-dirty", "0.2.0+c40264d-dirty"},
	} {
		if got := version(tc.release, tc.build); got != tc.want {
			t.Errorf("version(%q, %q) = %q, want %q", tc.release, tc.build, got, tc.want)
		}
	}
}
