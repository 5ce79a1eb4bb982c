package check

import (
	"fmt"
	"io"
	"strings"
)

// Report is the whole check. Every string field is filled: a value, or
// "unknown (why)". Text and JSON carry the same fields.
type Report struct {
	Verdict       string   `json:"verdict"`
	GDS           string   `json:"gds"`
	CuFileCompat  string   `json:"cufile_compat"`
	POSIXPath     string   `json:"posix_path"`
	StagingDevice string   `json:"staging_device"`
	System        System   `json:"system"`
	CUDA          CUDA     `json:"cuda"`
	CuFile        CuFile   `json:"cufile"`
	Dir           Dir      `json:"dir"`
	Advice        []string `json:"advice"`
}

// System is the kernel and FUSE side.
type System struct {
	Kernel      string `json:"kernel"`
	DevFuse     string `json:"dev_fuse"`
	Root        string `json:"root"`
	Fusermount  string `json:"fusermount"`
	Passthrough string `json:"fuse_passthrough"`
}

// CUDA is the driver and its devices.
type CUDA struct {
	LibCUDA string   `json:"libcuda"`
	Driver  string   `json:"driver_cuda_version"`
	Count   string   `json:"device_count"`
	Devices []Device `json:"devices"` // never null
}

// Device is one GPU.
type Device struct {
	Ordinal int    `json:"ordinal"`
	UUID    string `json:"uuid"`
	Name    string `json:"name"`
	Memory  string `json:"memory"`
}

// CuFile is libcufile, its configuration and nvidia-fs.
type CuFile struct {
	Library     string `json:"library"`
	Version     string `json:"version"`
	NvidiaFS    string `json:"nvidia_fs"`
	ConfigFile  string `json:"cufile_json"`
	ForceCompat string `json:"force_compat_mode_env"`
	DriverOpen  string `json:"driver_open"`
	Mode        string `json:"mode"`
}

// Dir is the directory checked and its filesystem.
type Dir struct {
	Path        string `json:"path"`
	Filesystem  string `json:"filesystem"`
	BlockDevice string `json:"block_device"`
	UdevEntry   string `json:"udev_entry"`
	ODirect     string `json:"o_direct"`
	Register    string `json:"cufile_register"`
}

// WriteText prints the verdict line, then `name value` lines by section,
// then the advice.
func (r *Report) WriteText(w io.Writer) error {
	var b strings.Builder
	b.WriteString(r.Verdict + "\n")
	section := func(name string, kv ...string) {
		fmt.Fprintf(&b, "\n[%s]\n", name)
		for i := 0; i+1 < len(kv); i += 2 {
			fmt.Fprintf(&b, "%-22s %s\n", kv[i], kv[i+1])
		}
	}
	section("verdict", "gds", r.GDS, "cufile_compat", r.CuFileCompat, "posix_path", r.POSIXPath, "staging_device", r.StagingDevice)
	s := r.System
	section("system", "kernel", s.Kernel, "dev_fuse", s.DevFuse, "root", s.Root, "fusermount", s.Fusermount, "fuse_passthrough", s.Passthrough)
	c := r.CUDA
	kv := []string{"libcuda", c.LibCUDA, "driver_cuda_version", c.Driver, "device_count", c.Count}
	for _, d := range c.Devices {
		kv = append(kv, fmt.Sprintf("device.%d", d.Ordinal), fmt.Sprintf("%s %s %s", d.UUID, d.Name, d.Memory))
	}
	section("cuda", kv...)
	f := r.CuFile
	section("cufile", "library", f.Library, "version", f.Version, "nvidia_fs", f.NvidiaFS, "cufile_json", f.ConfigFile,
		"force_compat_mode_env", f.ForceCompat, "driver_open", f.DriverOpen, "mode", f.Mode)
	d := r.Dir
	section("dir", "path", d.Path, "filesystem", d.Filesystem, "block_device", d.BlockDevice, "udev_entry", d.UdevEntry,
		"o_direct", d.ODirect, "cufile_register", d.Register)
	b.WriteString("\n[to get the faster path]\n")
	for _, a := range r.Advice {
		b.WriteString("- " + a + "\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// unknown is the value of a field that could not be learned.
func unknown(why string) string { return "unknown (" + why + ")" }
