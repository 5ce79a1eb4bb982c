package check

import (
	"cmp"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/gdsfs/gdsfs/gpu"
	"github.com/gdsfs/gdsfs/gpu/cuda"
)

// DefaultDir is where the probes write their file when none is named: a
// disk filesystem on most machines (/tmp is often tmpfs).
const DefaultDir = "/var/tmp"

// Run checks the machine, probing the load paths with a file in dir.
func Run(dir string) *Report {
	if abs, err := filepath.Abs(dir); err == nil {
		dir = abs
	}
	r := &Report{System: system()}
	cr := cuda.Check()
	r.CUDA = cudaFields(cr)
	r.Topology = topology(cr)
	compatText, compatAllowed := cufileJSON()
	r.CuFile = cufileFields(cr, compatText)
	d := inspectDir(dir)
	p := runProbes(dir)
	d.Register = p.register
	r.Dir = d.Dir
	r.StagingDevice = p.device
	r.POSIXPath = p.posix
	r.GDS = gdsVerdict(cr, p, dir)
	r.CuFileCompat = compatVerdict(cr, p)
	r.CuFilePath = p.cufilePath
	r.Verdict = fmt.Sprintf("GDS: %s; cuFile compat: %s; cuFile read path: %s; POSIX path: %s; staging device: %s",
		r.GDS, r.CuFileCompat, short(r.CuFilePath), short(r.POSIXPath), short(r.StagingDevice))
	r.Advice = advice(r, cr, d, p, compatAllowed)
	return r
}

// short is s up to its first " (" detail.
func short(s string) string {
	if i := strings.Index(s, " ("); i > 0 {
		return s[:i]
	}
	return s
}

func cudaFields(cr cuda.Report) CUDA {
	c := CUDA{Devices: []Device{}}
	if cr.LibCUDA == "" {
		c.LibCUDA = "not loaded: " + cr.Error
		c.Driver, c.Count = unknown("libcuda.so.1 not loaded"), unknown("libcuda.so.1 not loaded")
		return c
	}
	c.LibCUDA = cr.LibCUDA
	c.Driver = cr.DriverVersion
	if c.Driver == "" {
		c.Driver = unknown(cr.Error)
	}
	c.Count = fmt.Sprint(cr.DeviceCount)
	for _, d := range cr.Devices {
		dev := Device{Ordinal: d.Ordinal, UUID: d.UUID, Name: d.Name, Memory: fmt.Sprintf("%.1f GiB", float64(d.TotalMemory)/(1<<30))}
		if d.Error != "" {
			dev.UUID, dev.Name, dev.Memory = unknown(d.Error), unknown(d.Error), unknown(d.Error)
		}
		c.Devices = append(c.Devices, dev)
	}
	return c
}

// topology is every pair of GPUs the driver reports.
func topology(cr cuda.Report) []Pair {
	out := []Pair{}
	for _, p := range cr.Peers {
		access := "yes"
		switch {
		case p.Error != "":
			access = "unknown (" + p.Error + "): replicas are staged from host"
		case !p.Access():
			access = fmt.Sprintf("no (gpu%d->gpu%d %v, gpu%d->gpu%d %v): replicas are staged from host", p.A, p.B, p.AtoB, p.B, p.A, p.BtoA)
		}
		out = append(out, Pair{A: p.A, B: p.B, PeerAccess: access, Link: p.Link, PerfRank: p.PerfRank})
	}
	return out
}

func cufileFields(cr cuda.Report, configText string) CuFile {
	cf := cr.CuFile
	f := CuFile{Library: cf.Library, Version: cf.Version, ConfigFile: configText, Mode: cf.Mode}
	if cf.LoadError != "" {
		f.Library = "not loaded: " + cf.LoadError
	}
	if f.Version == "" {
		f.Version = unknown(map[bool]string{true: "libcufile.so.0 not loaded", false: "the library has no cuFileGetVersion"}[cf.LoadError != ""])
	}
	f.NvidiaFS = "not loaded (no /proc/driver/nvidia-fs/version)"
	if cf.NvidiaFS {
		f.NvidiaFS = "loaded (" + cmp.Or(cf.NvidiaFSV, "version unreadable") + ")"
	}
	f.ForceCompat = "unset"
	if v, ok := os.LookupEnv("CUFILE_FORCE_COMPAT_MODE"); ok {
		f.ForceCompat = v
		if v == "" {
			f.ForceCompat = "set, empty"
		}
	}
	switch {
	case cf.DriverOpen:
		f.DriverOpen = "yes"
	case cr.LibCUDA == "" || cf.LoadError != "":
		f.DriverOpen = "not tried (" + strings.TrimPrefix(cf.Mode, "unavailable: ") + ")"
	default:
		f.DriverOpen = "no: " + strings.TrimPrefix(cf.Mode, "unavailable: ")
	}
	return f
}

// gdsVerdict says whether true GDS (nvidia-fs DMA) serves files in dir,
// or the first reason it does not.
func gdsVerdict(cr cuda.Report, p probes, dir string) string {
	switch {
	case cr.LibCUDA == "":
		return "not available because no NVIDIA driver answers (libcuda.so.1 not loaded)"
	case cr.DeviceCount == 0:
		return "not available because the driver reports no GPU"
	case cr.CuFile.LoadError != "":
		return "not available because libcufile.so.0 is not installed"
	case !cr.CuFile.NvidiaFS:
		return "not available because the nvidia-fs kernel module is not loaded"
	case !cr.CuFile.DriverOpen:
		return "not available because cuFileDriverOpen failed"
	case p.kind != gpu.KindCUDA:
		return "not available because staging does not use the GPU"
	case !p.registered:
		return "not available because cuFile refuses files in " + dir
	case p.cufileMode != "gds":
		return "not available because cuFile runs in " + p.cufileMode + " mode"
	case !p.cufileWorks:
		return "not available because the cuFile read in " + dir + " failed"
	}
	return "available (nvidia-fs " + cmp.Or(cr.CuFile.NvidiaFSV, "loaded") + ")"
}

// compatVerdict says whether cuFile's compatibility path works.
func compatVerdict(cr cuda.Report, p probes) string {
	switch {
	case cr.LibCUDA == "":
		return "unavailable (no GPU)"
	case cr.CuFile.LoadError != "":
		return "unavailable (no libcufile.so.0)"
	case !cr.CuFile.DriverOpen:
		return "unavailable (cuFileDriverOpen failed)"
	case p.cufileMode == "gds":
		return "not needed (GDS mode)"
	case p.cufileWorks:
		return "works"
	case !p.registered:
		return "fails (cuFileHandleRegister refused the file)"
	}
	return "fails (the cuFile read failed)"
}

// advice lists what would make the faster path available, most
// important first.
func advice(r *Report, cr cuda.Report, d dirFacts, p probes, compatAllowed bool) []string {
	var out []string
	add := func(s string) { out = append(out, s) }
	if cr.LibCUDA == "" {
		add("No NVIDIA driver answers (libcuda.so.1): install the driver to stage into GPU memory; until then gdsfs stages into host memory (memfds) and leases host mappings.")
	}
	if cr.CuFile.LoadError != "" {
		add("Install cuFile (libcufile.so.0: the CUDA toolkit's GPUDirect Storage packages, e.g. nvidia-gds or libcufile-<version>) for the cuFile path; gdsfs also finds it under /usr/local/cuda*/targets/*/lib.")
	}
	if !cr.CuFile.NvidiaFS {
		add("Load the nvidia-fs kernel module (modprobe nvidia_fs; nvidia-fs-dkms from the GDS install) for true GDS: storage DMA straight into GPU memory. Without it cuFile can only run its compatibility mode, and gdsfs's POSIX path (pinned bounce buffers) is usually as fast or faster.")
	}
	if d.block && !d.udev {
		add(fmt.Sprintf("cuFile refuses files on block device %s (5018 unsupported file type) without a udev database entry (%s): run udevd, or in a container mount the host's /run/udev read-only.", d.BlockDevice, strings.TrimPrefix(strings.TrimSuffix(d.UdevEntry, ")"), "missing (")))
	}
	if !d.oDirect {
		add(fmt.Sprintf("%s (%s) does not do O_DIRECT: GPUDirect Storage (cuFile in gds mode) and io.direct_io auto or on need a filesystem that does (ext4, xfs, NFS or Lustre with GDS support); gdsfs's default POSIX path reads buffered and works here. Point --dir at where the data lives.", d.Path, d.fstype))
	}
	if !compatAllowed {
		add("cufile.json sets allow_compat_mode false: without nvidia-fs cuFile then refuses every file; set it true (or CUFILE_FORCE_COMPAT_MODE=true) to use cuFile's compatibility mode.")
	}
	if cr.CuFile.DriverOpen && !cr.CuFile.NvidiaFS && !p.cufileWorks && os.Getenv("CUFILE_FORCE_COMPAT_MODE") == "" {
		add("cuFile's compatibility mode without nvidia-fs: try CUFILE_FORCE_COMPAT_MODE=true in the daemon's environment (systemd: Environment=).")
	}
	if strings.HasPrefix(r.System.Passthrough, "no") {
		add("FUSE passthrough (reads through the mount at native speed) needs Linux >= 6.9 and root: " + r.System.Passthrough + ".")
	}
	if len(out) == 0 {
		add("nothing: every path is available here.")
	}
	return out
}
