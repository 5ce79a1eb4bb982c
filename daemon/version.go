package daemon

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/gdsfs/gdsfs"
	"github.com/gdsfs/gdsfs/gpu/cuda"
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

// versionText adds the devices, the CUDA driver and cuFile to the
// binary's versions.
func (d *daemon) versionText() string {
	var b strings.Builder
	b.WriteString(VersionText())
	for _, dev := range d.devs {
		fmt.Fprintf(&b, "device %s (%s)\n", dev.Name(), dev.Kind())
	}
	if d.devs[0].Kind() == "cuda" {
		r := cuda.Check()
		fmt.Fprintf(&b, "cuda-driver %s\n", r.DriverVersion)
		fmt.Fprintf(&b, "cufile %s\n", r.CuFile.Version)
	}
	fmt.Fprintf(&b, "cufile-mode %s\n", cufileMode(d.devs))
	return b.String()
}
