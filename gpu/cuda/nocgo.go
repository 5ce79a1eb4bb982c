//go:build !cgo

package cuda

import (
	"errors"
	"fmt"
)

// Without cgo there is no way to call the driver. This file stands in for
// lib.go and libcufile.go so the package (and gdsfs) still builds: Open, Map
// and Check fail at loadCUDA with errNoCgo, and nothing below it is reached.

var errNoCgo = errors.New("libcuda.so.1 not loaded: gdsfs was built without cgo (CGO_ENABLED=0)")

func loadCUDA() error             { return errNoCgo }
func libPath(int) string          { return "" }
func errorName(code int) string   { return fmt.Sprintf("CUresult(%d)", code) }
func driverVersion() (int, error) { return 0, errNoCgo }
func deviceCount() (int, error)   { return 0, errNoCgo }
func loadCuFileLib() error        { return errNoCgo }
func cufileVersion() (int, bool)  { return 0, false }
func cufileHasStats() error       { return errNoCgo }
func cufileStatsStart(int) error  { return errNoCgo }
func cufileReadStats(int) (CuFileStats, error) {
	return CuFileStats{GPUs: []CuFileGPUStats{}}, errNoCgo
}
func queryDevice(int) (deviceInfo, error) { return deviceInfo{}, errNoCgo }

type deviceInfo struct {
	ordinal int
	uuid    [16]byte
	model   string
	total   int64
}

type cuContext struct{}

func retainContext(deviceInfo) (*cuContext, error)          { return nil, errNoCgo }
func (*cuContext) release() error                           { return errNoCgo }
func (*cuContext) memInfo() (int64, int64, error)           { return 0, 0, errNoCgo }
func (*cuContext) granularity() (int64, error)              { return 0, errNoCgo }
func (*cuContext) rdmaVMMSupported() bool                   { return false }
func (*cuContext) setRDMA(bool)                             {}
func (*cuContext) rdmaOn() bool                             { return false }
func (*cuContext) memCreate(int64) (uint64, error)          { return 0, errNoCgo }
func (*cuContext) memRelease(uint64) error                  { return errNoCgo }
func (*cuContext) reserve(int64) (uint64, error)            { return 0, errNoCgo }
func (*cuContext) addressFree(uint64, int64) error          { return errNoCgo }
func (*cuContext) mapMem(uint64, int64, uint64) error       { return errNoCgo }
func (*cuContext) unmap(uint64, int64) error                { return errNoCgo }
func (*cuContext) setAccess(uint64, int64) error            { return errNoCgo }
func (*cuContext) exportFD(uint64) (int, error)             { return -1, errNoCgo }
func (*cuContext) importFD(int) (uint64, error)             { return 0, errNoCgo }
func (*cuContext) copyDtoD(uint64, uint64, int64) error     { return errNoCgo }
func (*cuContext) memsetZero(uint64, int64) error           { return errNoCgo }
func (*cuContext) copyDtoH([]byte, uint64) error            { return errNoCgo }
func (*cuContext) newPipe(int) (*pipe, error)               { return nil, errNoCgo }
func (*cuContext) cufileDriverOpen() error                  { return errNoCgo }
func (*cuContext) cufileDriverClose() error                 { return errNoCgo }
func (*cuContext) cufileRegister(int) (cufileHandle, error) { return cufileHandle{}, errNoCgo }
func (*cuContext) cufileDeregister(cufileHandle)            {}
func (*cuContext) cufileBufRegister(uint64, int64) error    { return errNoCgo }
func (*cuContext) cufileBufDeregister(uint64) error         { return errNoCgo }
func (*cuContext) cufileRead(cufileHandle, uint64, int, int64, int64) (int, error) {
	return 0, errNoCgo
}

type pipe struct{}

func (*pipe) buffer(int) []byte           { return nil }
func (*pipe) htod(int, uint64, int) error { return errNoCgo }
func (*pipe) wait(int) error              { return errNoCgo }
func (*pipe) dtoh([]byte, uint64) error   { return errNoCgo }
func (*pipe) free() error                 { return nil }

type cufileHandle struct{}

func devContext(deviceInfo) *cuContext                             { return &cuContext{} }
func canAccessPeer(_, _ *cuContext) (bool, error)                  { return false, errNoCgo }
func p2pRank(_, _ *cuContext) (int, error)                         { return 0, errNoCgo }
func (*cuContext) enablePeer(*cuContext) error                     { return errNoCgo }
func (*cuContext) setAccessFor(*cuContext, uint64, int64) error    { return errNoCgo }
func copyPeer(*cuContext, uint64, *cuContext, uint64, int64) error { return errNoCgo }
func nvmlLinks(_, _ string) (nvlinks, error)                       { return nvlinks{}, errNoCgo }
