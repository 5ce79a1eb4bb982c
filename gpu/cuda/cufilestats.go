package cuda

import (
	"fmt"
	"os"
	"strconv"
	"sync"
)

// CuFileStats is cuFile's own count of what it read in this process since
// its statistics started (when the driver first opened): level 1's totals
// and, at level 3, each GPU's reads by path.
type CuFileStats struct {
	Level      int              `json:"level"`       // the statistics level in force: 1, 2 or 3
	ReadBytes  uint64           `json:"read_bytes"`  // every cuFileRead, all GPUs
	ReadOps    uint64           `json:"read_ops"`    // cuFileReads that succeeded
	ReadErrors uint64           `json:"read_errors"` // cuFileReads that failed
	GPUs       []CuFileGPUStats `json:"gpus"`        // level 3 only
}

// CuFileGPUStats is one GPU's reads as cuFile counted them. cuFile counts
// bytes per GPU and reads per path: nvfs (GPUDirect Storage through
// nvidia-fs), posix (its compatibility mode) and p2p (PCIe P2PDMA).
type CuFileGPUStats struct {
	Name       string `json:"name"`  // "GPU-<uuid>", or "gpuN" where cuFile gives no UUID
	Index      int    `json:"index"` // cuFile's GPU index (the CUDA ordinal)
	ReadBytes  uint64 `json:"read_bytes"`
	Reads      uint64 `json:"reads"`
	NvfsReads  uint64 `json:"nvfs_reads"`
	PosixReads uint64 `json:"posix_reads"`
	P2PReads   uint64 `json:"p2p_reads"`
	ReadErrors uint64 `json:"read_errors"`
}

// GPU returns the counters of the GPU named name, matched by UUID, or
// else by ordinal (cuFile's index is the process's CUDA ordinal).
func (s CuFileStats) GPU(name string, ordinal int) (CuFileGPUStats, bool) {
	for _, g := range s.GPUs {
		if g.Name == name {
			return g, true
		}
	}
	for _, g := range s.GPUs {
		if g.Index == ordinal {
			return g, true
		}
	}
	return CuFileGPUStats{}, false
}

// ReadPath names the path cuFile took for the reads on the GPU named name
// between before and after, from its own counters: "gds" (nvidia-fs or
// P2PDMA reads), "compat (posix)", both joined with "+", or "none" when
// it counted no read there.
func ReadPath(before, after CuFileStats, name string, ordinal int) string {
	b, _ := before.GPU(name, ordinal)
	a, ok := after.GPU(name, ordinal)
	if !ok {
		return "none"
	}
	gds := a.NvfsReads+a.P2PReads > b.NvfsReads+b.P2PReads
	posix := a.PosixReads > b.PosixReads
	switch {
	case gds && posix:
		return "gds+compat (posix)"
	case gds:
		return "gds"
	case posix:
		return "compat (posix)"
	}
	return "none"
}

func cufileGPUName(index int, uuid [16]byte) string {
	if uuid == ([16]byte{}) {
		return fmt.Sprintf("gpu%d", index)
	}
	return formatUUID(uuid)
}

// statsLevel is the level CUFILE_STATS_LEVEL asks for (3 when unset).
func statsLevel(env string) (int, error) {
	if env == "" {
		return 3, nil
	}
	n, err := strconv.Atoi(env)
	switch {
	case err != nil || n < 0 || n > 3:
		return 0, fmt.Errorf("CUFILE_STATS_LEVEL=%q: want 1, 2 or 3", env)
	case n == 0:
		return 0, fmt.Errorf("CUFILE_STATS_LEVEL=0 turns them off")
	}
	return n, nil
}

// cufileStats is the process's cuFile statistics: started after the
// driver opens, read only while it is open.
var cufileStats struct {
	mu    sync.Mutex // held while the statistics are read
	level int        // 0 unless started and the driver is open
	why   string     // why they are unavailable, once tried
}

// startCuFileStats turns on cuFile's statistics at the level
// CUFILE_STATS_LEVEL asks for. libcufile must be loaded. A library
// without the statistics API, or one that refuses, leaves them
// unavailable with the reason.
func startCuFileStats() {
	cufileStats.mu.Lock()
	defer cufileStats.mu.Unlock()
	level, err := statsLevel(os.Getenv("CUFILE_STATS_LEVEL"))
	if err == nil {
		err = cufileHasStats()
	}
	if err == nil {
		err = cufileStatsStart(level)
	}
	if err != nil {
		cufileStats.level, cufileStats.why = 0, err.Error()
		return
	}
	cufileStats.level, cufileStats.why = level, ""
}

// stopCuFileStats marks the statistics unreadable before the driver
// closes.
func stopCuFileStats() {
	cufileStats.mu.Lock()
	defer cufileStats.mu.Unlock()
	if cufileStats.level != 0 {
		cufileStats.level, cufileStats.why = 0, "the cuFile driver is closed"
	}
}

// CuFileStatistics reads cuFile's own counters, or says why there are
// none ("" when there are).
func CuFileStatistics() (CuFileStats, string) {
	cufileStats.mu.Lock()
	defer cufileStats.mu.Unlock()
	if cufileStats.level == 0 {
		why := cufileStats.why
		if why == "" {
			why = "the cuFile driver was never opened in this process"
		}
		return CuFileStats{GPUs: []CuFileGPUStats{}}, why
	}
	st, err := cufileReadStats(cufileStats.level)
	if err != nil {
		return st, err.Error()
	}
	return st, ""
}
