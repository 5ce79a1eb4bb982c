// Package gdsfs holds what the whole project shares: the documented default
// configuration (config.yaml, embedded) and the version.
package gdsfs

import (
	_ "embed"
	"strings"
)

// DefaultConfig is config.yaml at the repository root: every key, commented.
//
//go:embed config.yaml
var DefaultConfig []byte

// release is the release version of the binary and of the Python package
// alike: python/gdsfs/VERSION is its one source (the wheel's metadata and
// gdsfs.__version__ read the same file).
//
//go:embed python/gdsfs/VERSION
var release string

// Build names the commit, set at link time
// (-ldflags "-X github.com/gdsfs/gdsfs.Build=$(git describe --always --dirty)").
var Build = ""

// Version is the release ("0.2.0"), followed by "+" and Build where the
// binary was linked with one ("0.2.0+c40264d-dirty"). Clients compare the
// part before "+" with their own release.
var Version = version(release, Build)

func version(release, build string) string {
	v := strings.TrimSpace(release)
	if build != "" {
		v += "+" + build
	}
	return v
}

// Release is Version without the build: what a client of the same release
// reports as its own version.
func Release() string { return strings.TrimSpace(release) }
