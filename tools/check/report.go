package check

import (
	"fmt"
	"io"
	"strings"
)

// Report is the whole check. Every string field is filled: a value, or
// "unknown (why)". Text and JSON carry the same fields.
type Report struct {
	Verdict      string `json:"verdict"`
	GDS          string `json:"gds"`
	CuFileCompat string `json:"cufile_compat"`
	// CuFilePath is the path cuFile's own counters say the probe's read
	// took: gds, compat (posix), none, or why that is not known.
	CuFilePath    string   `json:"cufile_path"`
	POSIXPath     string   `json:"posix_path"`
	StagingDevice string   `json:"staging_device"`
	System        System   `json:"system"`
	CUDA          CUDA     `json:"cuda"`
	Topology      []Pair   `json:"topology"` // every pair of GPUs; never null
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

// Pair is two GPUs: whether replicas are copied between them device to
// device, and what joins them.
type Pair struct {
	A          int    `json:"a"`
	B          int    `json:"b"`
	PeerAccess string `json:"peer_access"` // "yes", or "no (why): replicas are staged from host"
	Link       string `json:"link"`        // "NV18", "NV18 through NVSwitch", "PCIe or unknown (why)"
	PerfRank   int    `json:"perf_rank"`   // cuDeviceGetP2PAttribute PERFORMANCE_RANK (lower is better)
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
	section("verdict", "gds", r.GDS, "cufile_compat", r.CuFileCompat, "cufile_path", r.CuFilePath, "posix_path", r.POSIXPath, "staging_device", r.StagingDevice)
	s := r.System
	section("system", "kernel", s.Kernel, "dev_fuse", s.DevFuse, "root", s.Root, "fusermount", s.Fusermount, "fuse_passthrough", s.Passthrough)
	c := r.CUDA
	kv := []string{"libcuda", c.LibCUDA, "driver_cuda_version", c.Driver, "device_count", c.Count}
	for _, d := range c.Devices {
		kv = append(kv, fmt.Sprintf("device.%d", d.Ordinal), fmt.Sprintf("%s %s %s", d.UUID, d.Name, d.Memory))
	}
	section("cuda", kv...)
	kv = nil
	for _, p := range r.Topology {
		kv = append(kv, fmt.Sprintf("gpu%d-gpu%d", p.A, p.B), fmt.Sprintf("peer access %s; link %s; perf rank %d", p.PeerAccess, p.Link, p.PerfRank))
	}
	if len(kv) == 0 {
		kv = []string{"pairs", fmt.Sprintf("none (%d GPUs): replicas need two", len(c.Devices))}
	}
	section("topology", kv...)
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
