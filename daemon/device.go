package daemon

import (
	"go.uber.org/zap"

	"github.com/gdsfs/gdsfs/gpu"
	"github.com/gdsfs/gdsfs/internal/devices"
	"github.com/gdsfs/gdsfs/staging"
)

// openDevices opens the devices staging.device and staging.gpus name
// (internal/devices).
func openDevices(o staging.Options, log *zap.Logger) ([]gpu.Device, error) {
	return devices.Open(o, log)
}

func closeDevices(devs []gpu.Device) { devices.Close(devs) }

// cufileMode is the stats.json cufile_mode of the first device.
func cufileMode(devs []gpu.Device) string { return devices.CuFileMode(devs) }
