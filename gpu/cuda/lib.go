package cuda

/*
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"sync"
	"unsafe"
)

// This file, libcufile.go and libpeer.go are the only Go files that
// import "C". They turn the shim's C calls into Go values and errors;
// everything else in the package is plain Go.

const errBufLen = 1024

var libcuda struct {
	once sync.Once
	err  error
}

// loadCUDA loads libcuda.so.1 and calls cuInit once per process. A missing
// library or symbol, or a failing cuInit, is returned every time after.
func loadCUDA() error {
	libcuda.once.Do(func() {
		var buf [errBufLen]C.char
		if C.gds_cuda_load(&buf[0], C.size_t(len(buf))) != 0 {
			libcuda.err = errors.New(C.GoString(&buf[0]))
			return
		}
		libcuda.err = cuErr("cuInit", C.gds_init())
	})
	return libcuda.err
}

// libPath says which file a loaded library came from: 0 libcuda, 1 libcufile.
func libPath(which int) string {
	var buf [4096]C.char
	if C.gds_lib_path(C.int(which), &buf[0], C.size_t(len(buf))) != 0 {
		return ""
	}
	return C.GoString(&buf[0])
}

// cuErr turns a CUresult into an error naming op, or nil on CUDA_SUCCESS.
func cuErr(op string, r C.CUresult) error {
	if r == C.GDS_CUDA_SUCCESS {
		return nil
	}
	return &cudaError{op: op, code: int(r), name: errorName(int(r))}
}

// errorName is cuGetErrorName's answer, or "CUresult(N)" when it has none.
func errorName(code int) string {
	if p := C.gds_error_name(C.CUresult(code)); p != nil {
		return C.GoString(p)
	}
	return fmt.Sprintf("CUresult(%d)", code)
}

func driverVersion() (int, error) {
	var v C.int
	err := cuErr("cuDriverGetVersion", C.gds_driver_version(&v))
	return int(v), err
}

func deviceCount() (int, error) {
	var n C.int
	err := cuErr("cuDeviceGetCount", C.gds_device_count(&n))
	return int(n), err
}

// deviceInfo is what the driver says about one device without a context.
type deviceInfo struct {
	ordinal int
	dev     C.CUdevice
	uuid    [16]byte
	model   string
	total   int64
}

func queryDevice(ordinal int) (deviceInfo, error) {
	info := deviceInfo{ordinal: ordinal}
	if err := cuErr("cuDeviceGet", C.gds_device_get(C.int(ordinal), &info.dev)); err != nil {
		return info, err
	}
	var u C.CUuuid
	if err := cuErr("cuDeviceGetUuid", C.gds_device_uuid(info.dev, &u)); err != nil {
		return info, err
	}
	for i := range info.uuid {
		info.uuid[i] = byte(u.bytes[i])
	}
	var name [256]C.char
	if err := cuErr("cuDeviceGetName", C.gds_device_name(info.dev, &name[0], C.int(len(name)))); err != nil {
		return info, err
	}
	info.model = C.GoString(&name[0])
	var total C.size_t
	if err := cuErr("cuDeviceTotalMem_v2", C.gds_device_total_mem(info.dev, &total)); err != nil {
		return info, err
	}
	info.total = int64(total)
	return info, nil
}

// cuContext is a retained primary context and the device it belongs to.
// Every method makes the context current inside the C call it makes.
type cuContext struct {
	ctx  C.CUcontext
	dev  C.CUdevice
	rdma C.int // allocations are GPUDirect RDMA capable (set before the first)
}

func retainContext(info deviceInfo) (*cuContext, error) {
	c := &cuContext{dev: info.dev}
	if err := cuErr("cuDevicePrimaryCtxRetain", C.gds_ctx_retain(info.dev, &c.ctx)); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *cuContext) release() error {
	return cuErr("cuDevicePrimaryCtxRelease_v2", C.gds_ctx_release(c.dev))
}

func (c *cuContext) memInfo() (free, total int64, err error) {
	var f, t C.size_t
	err = cuErr("cuMemGetInfo_v2", C.gds_mem_info(c.ctx, &f, &t))
	return int64(f), int64(t), err
}

// rdmaVMMSupported says whether VMM allocations on this device can be
// GPUDirect RDMA capable.
func (c *cuContext) rdmaVMMSupported() bool {
	var v C.int
	r := C.gds_device_attr(c.dev, C.GDS_CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, &v)
	return r == C.GDS_CUDA_SUCCESS && v != 0
}

// setRDMA makes later allocations GPUDirect RDMA capable. Call it before
// the first allocation, never concurrently with one.
func (c *cuContext) setRDMA(on bool) {
	c.rdma = 0
	if on {
		c.rdma = 1
	}
}

func (c *cuContext) rdmaOn() bool { return c.rdma != 0 }

func (c *cuContext) granularity() (int64, error) {
	var g C.size_t
	err := cuErr("cuMemGetAllocationGranularity", C.gds_granularity(c.ctx, c.dev, c.rdma, &g))
	return int64(g), err
}

func (c *cuContext) memCreate(size int64) (uint64, error) {
	var h C.CUmemGenericAllocationHandle
	err := cuErr("cuMemCreate", C.gds_mem_create(c.ctx, c.dev, c.rdma, C.size_t(size), &h))
	return uint64(h), err
}

func (c *cuContext) memRelease(h uint64) error {
	return cuErr("cuMemRelease", C.gds_mem_release(c.ctx, C.CUmemGenericAllocationHandle(h)))
}

func (c *cuContext) reserve(size int64) (uint64, error) {
	var p C.CUdeviceptr
	err := cuErr("cuMemAddressReserve", C.gds_va_reserve(c.ctx, C.size_t(size), &p))
	return uint64(p), err
}

func (c *cuContext) addressFree(ptr uint64, size int64) error {
	return cuErr("cuMemAddressFree", C.gds_va_free(c.ctx, C.CUdeviceptr(ptr), C.size_t(size)))
}

func (c *cuContext) mapMem(ptr uint64, size int64, h uint64) error {
	return cuErr("cuMemMap", C.gds_mem_map(c.ctx, C.CUdeviceptr(ptr), C.size_t(size),
		C.CUmemGenericAllocationHandle(h)))
}

func (c *cuContext) unmap(ptr uint64, size int64) error {
	return cuErr("cuMemUnmap", C.gds_mem_unmap(c.ctx, C.CUdeviceptr(ptr), C.size_t(size)))
}

func (c *cuContext) setAccess(ptr uint64, size int64) error {
	return cuErr("cuMemSetAccess", C.gds_mem_set_access(c.ctx, c.dev, C.CUdeviceptr(ptr), C.size_t(size)))
}

func (c *cuContext) exportFD(h uint64) (int, error) {
	var fd C.int
	err := cuErr("cuMemExportToShareableHandle",
		C.gds_mem_export_fd(c.ctx, C.CUmemGenericAllocationHandle(h), &fd))
	return int(fd), err
}

// importFD imports an exported POSIX fd as a new allocation handle; fd
// stays open.
func (c *cuContext) importFD(fd int) (uint64, error) {
	var h C.CUmemGenericAllocationHandle
	err := cuErr("cuMemImportFromShareableHandle", C.gds_mem_import_fd(c.ctx, C.int(fd), &h))
	return uint64(h), err
}

// memsetZero zeroes n device bytes at dst and waits for it.
func (c *cuContext) memsetZero(dst uint64, n int64) error {
	return cuErr("cuMemsetD8_v2", C.gds_memset_zero(c.ctx, C.CUdeviceptr(dst), C.size_t(n)))
}

// copyDtoD copies n bytes between device addresses and waits for the copy.
func (c *cuContext) copyDtoD(dst, src uint64, n int64) error {
	return cuErr("cuMemcpyDtoD_v2", C.gds_copy_dtod(c.ctx, C.CUdeviceptr(dst), C.CUdeviceptr(src), C.size_t(n)))
}

// copyDtoH copies len(dst) device bytes at src into dst (pageable memory;
// the driver stages it). Used for small reads.
func (c *cuContext) copyDtoH(dst []byte, src uint64) error {
	if len(dst) == 0 {
		return nil
	}
	return cuErr("cuMemcpyDtoH_v2", C.gds_copy_dtoh(c.ctx, unsafe.Pointer(&dst[0]), C.CUdeviceptr(src), C.size_t(len(dst))))
}

// pipe is two pinned host buffers, a non-blocking stream and two events.
type pipe struct {
	c *cuContext
	p *C.struct_gds_pipe
}

func (c *cuContext) newPipe(size int) (*pipe, error) {
	var p *C.struct_gds_pipe
	if err := cuErr("cuMemHostAlloc/cuStreamCreate/cuEventCreate", C.gds_pipe_new(c.ctx, C.size_t(size), &p)); err != nil {
		return nil, err
	}
	return &pipe{c: c, p: p}, nil
}

// buffer returns pinned buffer i (0 or 1) as a slice over C memory.
func (p *pipe) buffer(i int) []byte {
	return unsafe.Slice((*byte)(p.p.buf[i]), int(p.p.size))
}

func (p *pipe) htod(i int, dst uint64, n int) error {
	return cuErr("cuMemcpyHtoDAsync_v2", C.gds_pipe_htod(p.c.ctx, p.p, C.int(i), C.CUdeviceptr(dst), C.size_t(n)))
}

func (p *pipe) wait(i int) error {
	return cuErr("cuEventSynchronize", C.gds_pipe_wait(p.c.ctx, p.p, C.int(i)))
}

// dtoh copies len(dst) bytes at src into dst through the pinned buffers.
func (p *pipe) dtoh(dst []byte, src uint64) error {
	if len(dst) == 0 {
		return nil
	}
	return cuErr("cuMemcpyDtoHAsync_v2", C.gds_pipe_dtoh(p.c.ctx, p.p, unsafe.Pointer(&dst[0]),
		C.CUdeviceptr(src), C.size_t(len(dst))))
}

// free waits for the stream and frees the buffers, events and stream.
func (p *pipe) free() error {
	if p.p == nil {
		return nil
	}
	err := cuErr("cuStreamDestroy_v2", C.gds_pipe_free(p.c.ctx, p.p))
	p.p = nil
	return err
}
