package cuda

import (
	"fmt"
	"os"
	"strings"
)

// Report is what `gdsfs check` prints about the CUDA platform.
type Report struct {
	LibCUDA       string         `json:"libcuda"`            // file libcuda.so.1 was loaded from
	Error         string         `json:"error,omitempty"`    // why the driver could not be used
	DriverVersion string         `json:"driver_version"`     // CUDA version the driver supports, "13.0"
	DriverRaw     int            `json:"driver_version_raw"` // cuDriverGetVersion, 13000
	DeviceCount   int            `json:"device_count"`
	Devices       []DeviceReport `json:"devices"`
	// Peers is every pair of devices: peer access and the link.
	Peers  []PeerReport `json:"peers"`
	CuFile CuFileReport `json:"cufile"`
}

// DeviceReport describes one device.
type DeviceReport struct {
	Ordinal     int    `json:"ordinal"`
	Name        string `json:"name"`         // "NVIDIA H200"
	UUID        string `json:"uuid"`         // "GPU-...", Device.Name
	TotalMemory int64  `json:"total_memory"` // bytes
	Error       string `json:"error,omitempty"`
}

// CuFileReport describes libcufile and its driver.
type CuFileReport struct {
	Library    string `json:"library"`               // file libcufile.so.0 was loaded from
	LoadError  string `json:"load_error,omitempty"`  // why it did not load
	Version    string `json:"version,omitempty"`     // cuFileGetVersion, "1.15.0"
	VersionRaw int    `json:"version_raw,omitempty"` // 1000*major + 10*minor + patch
	NvidiaFS   bool   `json:"nvidia_fs"`             // the nvidia-fs module is loaded
	NvidiaFSV  string `json:"nvidia_fs_version,omitempty"`
	DriverOpen bool   `json:"driver_open"` // cuFileDriverOpen succeeded
	Mode       string `json:"mode"`        // "gds", "compat" or "unavailable: REASON"
}

// Check reports the driver, the devices and cuFile. It never fails: what
// could not be learned is said in the report, each failure once (a
// missing libcuda is r.Error; the cuFile mode then says only that).
func Check() Report {
	r := Report{Devices: []DeviceReport{}, Peers: []PeerReport{}}
	if err := loadCUDA(); err != nil {
		r.Error = err.Error()
		r.CuFile = cufileLibrary()
		r.CuFile.Mode = "unavailable: libcuda.so.1 not loaded"
		return r
	}
	r.LibCUDA = libPath(0)
	if v, err := driverVersion(); err != nil {
		r.Error = err.Error()
	} else {
		r.DriverRaw = v
		r.DriverVersion = fmt.Sprintf("%d.%d", v/1000, v%1000/10)
	}
	n, err := deviceCount()
	if err != nil {
		r.Error = err.Error()
	}
	r.DeviceCount = n
	var infos []deviceInfo
	for i := 0; i < n; i++ {
		dr := DeviceReport{Ordinal: i}
		if info, err := queryDevice(i); err != nil {
			dr.Error = err.Error()
		} else {
			dr.Name, dr.UUID, dr.TotalMemory = info.model, formatUUID(info.uuid), info.total
			infos = append(infos, info)
		}
		r.Devices = append(r.Devices, dr)
	}
	r.Peers = checkPeers(infos)
	r.CuFile = checkCuFile(n)
	return r
}

// cufileLibrary loads libcufile (without opening its driver, which needs
// a CUDA context) and reports where from, its version and nvidia-fs.
func cufileLibrary() CuFileReport {
	var cr CuFileReport
	cr.NvidiaFS = nvidiaFSPresent()
	if b, err := os.ReadFile(nvidiaFSVersion); err == nil {
		cr.NvidiaFSV = strings.TrimSpace(string(b))
	}
	cufileDriver.mu.Lock()
	if !cufileDriver.loaded {
		cufileDriver.loaded = true
		cufileDriver.loadErr = loadCuFileLib()
	}
	err := cufileDriver.loadErr
	cufileDriver.mu.Unlock()
	if err != nil {
		cr.LoadError = err.Error()
		return cr
	}
	cr.Library = libPath(1)
	if v, ok := cufileVersion(); ok {
		cr.VersionRaw = v
		cr.Version = fmt.Sprintf("%d.%d.%d", v/1000, v%1000/10, v%10)
	}
	return cr
}

// checkCuFile opens and closes the cuFile driver under device 0's context.
func checkCuFile(devices int) CuFileReport {
	cr := cufileLibrary()
	if cr.LoadError != "" {
		cr.Mode = "unavailable: libcufile.so.0 not loaded"
		return cr
	}
	if devices == 0 {
		cr.Mode = "unavailable: no CUDA device"
		return cr
	}
	info, err := queryDevice(0)
	if err != nil {
		cr.Mode = "unavailable: " + err.Error()
		return cr
	}
	ctx, err := retainContext(info)
	if err != nil {
		cr.Mode = "unavailable: " + err.Error()
		return cr
	}
	defer ctx.release()
	mode, err := acquireCuFile(ctx)
	if err != nil {
		cr.Mode = "unavailable: " + err.Error()
		return cr
	}
	cr.DriverOpen, cr.Mode = true, mode
	if err := releaseCuFile(ctx); err != nil {
		cr.Mode += " (close: " + err.Error() + ")"
	}
	return cr
}

// String is the report as `name value` lines (the GPU tests log it;
// `gdsfs check` prints tools/check's report).
func (r Report) String() string {
	var b strings.Builder
	line := func(k string, v any) { fmt.Fprintf(&b, "%-22s %v\n", k, v) }
	if r.Error != "" {
		line("cuda", "unavailable: "+r.Error)
	}
	line("libcuda", r.LibCUDA)
	line("driver_cuda_version", r.DriverVersion)
	line("devices", r.DeviceCount)
	for _, d := range r.Devices {
		if d.Error != "" {
			line(fmt.Sprintf("device.%d", d.Ordinal), "error: "+d.Error)
			continue
		}
		line(fmt.Sprintf("device.%d", d.Ordinal),
			fmt.Sprintf("%s %s %.1f GiB", d.UUID, d.Name, float64(d.TotalMemory)/(1<<30)))
	}
	for _, p := range r.Peers {
		line(fmt.Sprintf("peer.%d-%d", p.A, p.B), p.Summary())
	}
	line("cufile.library", r.CuFile.Library)
	if r.CuFile.LoadError != "" {
		line("cufile.load_error", r.CuFile.LoadError)
	}
	line("cufile.version", r.CuFile.Version)
	line("cufile.nvidia_fs", r.CuFile.NvidiaFS)
	line("cufile.driver_open", r.CuFile.DriverOpen)
	line("cufile.mode", r.CuFile.Mode)
	return b.String()
}
