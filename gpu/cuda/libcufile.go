package cuda

/*
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"unsafe"
)

// loadCuFileLib dlopens the first candidate that loads. When none does, the
// error carries the loader's message for a candidate file that exists but
// would not load, or else for the plain soname.
func loadCuFileLib() error {
	var reason string
	for _, path := range cufileSearch() {
		var buf [errBufLen]C.char
		cpath := C.CString(path)
		rc := C.gds_cufile_load(cpath, &buf[0], C.size_t(len(buf)))
		C.free(unsafe.Pointer(cpath))
		if rc == 0 {
			return nil
		}
		msg := C.GoString(&buf[0])
		if strings.HasPrefix(msg, "libcufile.so.0: symbol") {
			return fmt.Errorf("%s (in %s)", msg, path)
		}
		if reason == "" {
			reason = msg
		}
		if strings.Contains(path, "/") {
			if _, err := os.Stat(path); err == nil {
				return fmt.Errorf("libcufile.so.0: %s exists but does not load: %s", path, msg)
			}
		}
	}
	return fmt.Errorf("libcufile.so.0 not found: %s", reason)
}

// cufileVersion is cuFileGetVersion's answer; ok is false when the library
// has no such entry point or it failed.
func cufileVersion() (v int, ok bool) {
	if C.gds_cufile_has_version() == 0 {
		return 0, false
	}
	var cv C.int
	st := C.gds_cufile_version(&cv)
	return int(cv), st.err == C.GDS_CU_FILE_SUCCESS
}

func cfErr(op string, st C.CUfileError_t) error {
	if st.err == C.GDS_CU_FILE_SUCCESS {
		return nil
	}
	return &cuFileError{op: op, code: int(st.err), cuCode: int(st.cu_err)}
}

func (c *cuContext) cufileDriverOpen() error {
	return cfErr("cuFileDriverOpen", C.gds_cufile_driver_open(c.ctx))
}

func (c *cuContext) cufileDriverClose() error {
	return cfErr("cuFileDriverClose", C.gds_cufile_driver_close(c.ctx))
}

// cufileHandle is a CUfileHandle_t, a pointer owned by libcufile.
type cufileHandle struct{ h C.CUfileHandle_t }

func (c *cuContext) cufileRegister(fd int) (cufileHandle, error) {
	var h C.CUfileHandle_t
	err := cfErr("cuFileHandleRegister", C.gds_cufile_register(c.ctx, C.int(fd), &h))
	return cufileHandle{h: h}, err
}

func (c *cuContext) cufileDeregister(h cufileHandle) {
	C.gds_cufile_deregister(c.ctx, h.h)
}

func (c *cuContext) cufileBufRegister(base uint64, n int64) error {
	return cfErr("cuFileBufRegister", C.gds_cufile_buf_register(c.ctx, C.CUdeviceptr(base), C.size_t(n)))
}

func (c *cuContext) cufileBufDeregister(base uint64) error {
	return cfErr("cuFileBufDeregister", C.gds_cufile_buf_deregister(c.ctx, C.CUdeviceptr(base)))
}

// cufileRead is one cuFileRead of n bytes at fileOff into base+bufOff.
func (c *cuContext) cufileRead(h cufileHandle, base uint64, n int, fileOff, bufOff int64) (int, error) {
	var errnum, cuerr C.int
	got := C.gds_cufile_read(c.ctx, h.h, C.CUdeviceptr(base), C.size_t(n), C.off_t(fileOff), C.off_t(bufOff),
		&errnum, &cuerr)
	if got >= 0 {
		return int(got), nil
	}
	return 0, readError(int64(got), syscall.Errno(errnum), int(cuerr))
}

// cufileHasStats says why libcufile cannot give statistics: nil when it
// exports the statistics entry points.
func cufileHasStats() error {
	var buf [errBufLen]C.char
	if C.gds_cufile_has_stats(&buf[0], C.size_t(len(buf))) == 0 {
		return errors.New(C.GoString(&buf[0]))
	}
	return nil
}

// cufileStatsStart sets cuFile's statistics level and starts counting.
func cufileStatsStart(level int) error {
	return cfErr("cuFileSetStatsLevel/cuFileStatsStart", C.gds_cufile_stats_start(C.int(level)))
}

// cufileReadStats reads cuFile's statistics: level 1's totals and, at
// level 3, the per-GPU read counters.
func cufileReadStats(level int) (CuFileStats, error) {
	var l1 C.CUfileStatsLevel1_t
	var l3 C.CUfileStatsLevel3_t
	st := CuFileStats{Level: level, GPUs: []CuFileGPUStats{}}
	if err := cfErr("cuFileGetStatsL1/L3", C.gds_cufile_stats(C.int(level), &l1, &l3)); err != nil {
		return st, err
	}
	st.ReadBytes = uint64(l1.read_bytes)
	st.ReadOps = uint64(l1.read_ops.ok)
	st.ReadErrors = uint64(l1.read_ops.err)
	if level < 3 {
		return st, nil
	}
	n := min(int(l3.num_gpus), len(l3.per_gpu_stats))
	for i := 0; i < n; i++ {
		g := &l3.per_gpu_stats[i]
		var uuid [16]byte
		for j := range uuid {
			uuid[j] = byte(g.uuid[j])
		}
		st.GPUs = append(st.GPUs, CuFileGPUStats{
			Index: i, Name: cufileGPUName(i, uuid),
			ReadBytes: uint64(g.read_bytes), Reads: uint64(g.n_total_reads),
			NvfsReads: uint64(g.n_nvfs_reads), PosixReads: uint64(g.n_posix_reads),
			P2PReads: uint64(g.n_p2p_reads), ReadErrors: uint64(g.n_reads_err),
		})
	}
	return st, nil
}
