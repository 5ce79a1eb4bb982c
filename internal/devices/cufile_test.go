package devices

import (
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/gdsfs/gdsfs/gpu"
	"github.com/gdsfs/gdsfs/gpu/cuda"
	"github.com/gdsfs/gdsfs/gpu/host"
	"github.com/gdsfs/gdsfs/staging"
)

// cufileDevice is a host device that says cuFile runs in mode.
type cufileDevice struct {
	*host.Device
	mode string
}

func (d cufileDevice) CuFile() (gpu.CuFile, string) { return fakeCuFile(d.mode), "" }

type fakeCuFile string

func (m fakeCuFile) Mode() string                         { return string(m) }
func (fakeCuFile) Register(int) (gpu.CuFileHandle, error) { return nil, nil }

func TestCuFileSection(t *testing.T) {
	core, logs := observer.New(zapcore.WarnLevel)
	a := NewAttribution(zap.New(core))
	cuStats := cuda.CuFileStats{Level: 3, ReadBytes: 8192, GPUs: []cuda.CuFileGPUStats{{Name: "GPU-a", ReadBytes: 8192, PosixReads: 2}}}
	a.stats = func() (cuda.CuFileStats, string) { return cuStats, "" }
	devs := []gpu.Device{cufileDevice{host.Open(gpu.Options{}), "compat"}}
	staged := []staging.DeviceStats{{Name: "GPU-a", BytesCuFile: 8192}}

	if s := a.Section(devs, staged); s.Attribution != "ok" || s.Statistics != "level 3" || s.GPUs[0].PosixReads != 2 {
		t.Fatalf("matching counters: %+v", s)
	}
	staged[0].BytesCuFile = 4096
	for range 2 {
		if s := a.Section(devs, staged); s.Attribution != "mismatch gdsfs=4096 cufile=8192 on GPU-a" {
			t.Fatalf("mismatch: %+v", s)
		}
	}
	if n := logs.FilterMessageSnippet("disagrees").Len(); n != 1 {
		t.Errorf("mismatch logged %d times over two reads, want once", n)
	}

	a.stats = func() (cuda.CuFileStats, string) { return cuda.CuFileStats{}, "libcufile.so.0 has no cuFileGetStatsL3" }
	if s := a.Section(devs, staged); s.Statistics != "unavailable: libcufile.so.0 has no cuFileGetStatsL3" ||
		s.Attribution != "unavailable: cuFile statistics unavailable: libcufile.so.0 has no cuFileGetStatsL3" || s.GPUs == nil {
		t.Errorf("no statistics: %+v", s)
	}
	s := a.Section([]gpu.Device{host.Open(gpu.Options{})}, staged)
	if !strings.HasPrefix(s.Statistics, "unavailable: host backend") || !strings.HasPrefix(s.Attribution, "unavailable: no cuFile: host backend") {
		t.Errorf("host backend: %+v", s)
	}
}
