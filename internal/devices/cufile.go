package devices

import (
	"fmt"
	"strings"
	"sync/atomic"

	"go.uber.org/zap"

	"github.com/gdsfs/gdsfs/gpu"
	"github.com/gdsfs/gdsfs/gpu/cuda"
	"github.com/gdsfs/gdsfs/staging"
)

// CuFileSection is stats.json's cufile object: cuFile's own counters and
// whether gdsfs's attribution agrees with them.
type CuFileSection struct {
	// Statistics is "level N", or "unavailable: WHY" (host backend, no
	// libcufile, a libcufile without the statistics API).
	Statistics string `json:"statistics"`
	cuda.CuFileStats
	// Attribution is "ok", "pending: ...", "mismatch ..." or
	// "unavailable: WHY" (see cuda.Attribute).
	Attribution string `json:"attribution"`
}

// Attribution checks gdsfs's cuFile bytes against cuFile's counters each
// time the stats are read, and logs the first mismatch.
type Attribution struct {
	log    *zap.Logger
	stats  func() (cuda.CuFileStats, string)
	logged atomic.Bool
}

// NewAttribution reads cuFile's statistics in this process.
func NewAttribution(log *zap.Logger) *Attribution {
	return &Attribution{log: log, stats: cuda.CuFileStatistics}
}

// Section is the cufile object for devs, whose staging counters are
// staged (one per device, in order).
func (a *Attribution) Section(devs []gpu.Device, staged []staging.DeviceStats) CuFileSection {
	sec := CuFileSection{CuFileStats: cuda.CuFileStats{GPUs: []cuda.CuFileGPUStats{}}}
	cf, why := devs[0].CuFile()
	if cf == nil {
		sec.Statistics = "unavailable: " + why
		sec.Attribution = "unavailable: no cuFile: " + why
		return sec
	}
	st, why := a.stats()
	if why != "" {
		sec.Statistics = "unavailable: " + why
		sec.Attribution = "unavailable: cuFile statistics unavailable: " + why
		return sec
	}
	sec.Statistics, sec.CuFileStats = fmt.Sprintf("level %d", st.Level), st
	in := make([]cuda.StagedBytes, len(staged))
	for i, d := range staged {
		in[i] = cuda.StagedBytes{Name: d.Name, Ordinal: d.Ordinal, BytesCuFile: d.BytesCuFile, Loading: d.LoadingFiles}
	}
	sec.Attribution = cuda.Attribute(cf.Mode(), in, st)
	if strings.HasPrefix(sec.Attribution, "mismatch") && a.logged.CompareAndSwap(false, true) {
		a.log.Warn("gdsfs's load-path attribution disagrees with cuFile's own counters (logged once)",
			zap.String("cufile_mode", cf.Mode()), zap.String("attribution", sec.Attribution))
	}
	return sec
}
