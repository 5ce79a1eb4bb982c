// Package devices opens the staging devices that the configuration names
// (staging.device, staging.gpus): CUDA GPUs, or host memory where no GPU
// answers and the configuration allows it. It is shared by the daemon and
// the benchmarks; it never decides anything about staging itself.
package devices

import (
	"fmt"

	"go.uber.org/zap"

	"github.com/gdsfs/gdsfs/gpu"
	"github.com/gdsfs/gdsfs/gpu/cuda"
	"github.com/gdsfs/gdsfs/gpu/host"
	"github.com/gdsfs/gdsfs/staging"
)

// Open opens the devices staging.device and staging.gpus name. With auto,
// any GPU that does not answer makes it fall back to host memory, and the
// reason is logged.
func Open(o staging.Options, log *zap.Logger) ([]gpu.Device, error) {
	opts := gpu.Options{ChunkSize: int64(o.ChunkSize), WarmChunks: o.WarmChunks}
	if o.Device == staging.DeviceHost {
		return hostDevices(opts, o.HostDevices), nil
	}
	var devs []gpu.Device
	for _, ord := range o.GPUs {
		d, err := cuda.Open(ord, opts, log.Named("cuda"))
		if err == nil {
			devs = append(devs, d)
			continue
		}
		Close(devs)
		if o.Device == staging.DeviceCUDA {
			return nil, fmt.Errorf("staging.device: cuda: GPU %d: %w", ord, err)
		}
		log.Info("no GPU answers; staging into host memory", zap.Int("gpu", ord), zap.Error(err))
		return hostDevices(opts, o.HostDevices), nil
	}
	return devs, nil
}

// hostDevices is staging.host_devices host devices (one when 0 or 1).
func hostDevices(opts gpu.Options, n int) []gpu.Device {
	var out []gpu.Device
	for _, d := range host.OpenN(opts, n) {
		out = append(out, d)
	}
	return out
}

// Close closes every device.
func Close(devs []gpu.Device) {
	for _, d := range devs {
		d.Close()
	}
}

// CuFileMode is the stats.json cufile_mode: gds, compat or
// "unavailable: REASON" for the first device.
func CuFileMode(devs []gpu.Device) string {
	cf, why := devs[0].CuFile()
	if cf == nil {
		return "unavailable: " + why
	}
	return cf.Mode()
}
