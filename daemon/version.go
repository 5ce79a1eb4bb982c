package daemon

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/gdsfs/gdsfs"
)

// VersionText is what `gdsfs version` prints; the daemon's .gdsfs/version
// adds the device's driver and cuFile versions.
func VersionText() string {
	var b strings.Builder
	fmt.Fprintf(&b, "gdsfs %s\n", gdsfs.Version)
	fmt.Fprintf(&b, "go %s\n", runtime.Version())
	fmt.Fprintf(&b, "go-fuse %s\n", moduleVersion("github.com/hanwen/go-fuse/v2"))
	return b.String()
}

func moduleVersion(path string) string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	for _, m := range info.Deps {
		if m.Path == path {
			if m.Replace != nil {
				return m.Replace.Version
			}
			return m.Version
		}
	}
	return "unknown"
}
