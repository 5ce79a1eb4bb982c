package cuda

import (
	"errors"
	"fmt"
	"syscall"

	"github.com/gdsfs/gdsfs/gpu"
)

// cudaErrorOutOfMemory is CUDA_ERROR_OUT_OF_MEMORY.
const cudaErrorOutOfMemory = 2

// cufileCUDADriverError is CU_FILE_CUDA_DRIVER_ERROR: the CUresult is in
// CUfileError_t.cu_err.
const cufileCUDADriverError = 5011

// cudaError is a failed CUDA driver call. It unwraps to gpu.ErrOutOfMemory
// for CUDA_ERROR_OUT_OF_MEMORY, so errors.Is works through any wrapping.
type cudaError struct {
	op   string
	code int
	name string
}

func (e *cudaError) Error() string { return fmt.Sprintf("%s: %s (%d)", e.op, e.name, e.code) }

func (e *cudaError) Unwrap() error {
	if e.code == cudaErrorOutOfMemory {
		return gpu.ErrOutOfMemory
	}
	return nil
}

// cuFileError is a failed cuFile call: the CUfileOpError and, for
// CU_FILE_CUDA_DRIVER_ERROR, the CUresult behind it.
type cuFileError struct {
	op     string
	code   int
	cuCode int
}

func (e *cuFileError) Error() string {
	s := fmt.Sprintf("%s: %s", e.op, cufileStatusText(e.code))
	if e.code == cufileCUDADriverError && e.cuCode != 0 {
		s += fmt.Sprintf(": %s (%d)", errorName(e.cuCode), e.cuCode)
	}
	return s
}

func (e *cuFileError) Unwrap() error {
	if e.code == cufileCUDADriverError && e.cuCode == cudaErrorOutOfMemory {
		return gpu.ErrOutOfMemory
	}
	return nil
}

// cufileStatus maps CUfileOpError codes to their names and the text cufile.h
// gives them (CUFILEOP_STATUS_ENTRIES; CUFILEOP_BASE_ERR is 5000).
var cufileStatus = map[int][2]string{
	0:    {"CU_FILE_SUCCESS", "cufile success"},
	5001: {"CU_FILE_DRIVER_NOT_INITIALIZED", "nvidia-fs driver is not loaded; set allow_compat_mode to true in cufile.json to enable compatible mode"},
	5002: {"CU_FILE_DRIVER_INVALID_PROPS", "invalid property"},
	5003: {"CU_FILE_DRIVER_UNSUPPORTED_LIMIT", "property range error"},
	5004: {"CU_FILE_DRIVER_VERSION_MISMATCH", "nvidia-fs driver version mismatch"},
	5005: {"CU_FILE_DRIVER_VERSION_READ_ERROR", "nvidia-fs driver version read error"},
	5006: {"CU_FILE_DRIVER_CLOSING", "driver shutdown in progress"},
	5007: {"CU_FILE_PLATFORM_NOT_SUPPORTED", "GPUDirect Storage not supported on current platform"},
	5008: {"CU_FILE_IO_NOT_SUPPORTED", "GPUDirect Storage not supported on current file"},
	5009: {"CU_FILE_DEVICE_NOT_SUPPORTED", "GPUDirect Storage not supported on current GPU"},
	5010: {"CU_FILE_NVFS_DRIVER_ERROR", "nvidia-fs driver ioctl error"},
	5011: {"CU_FILE_CUDA_DRIVER_ERROR", "CUDA Driver API error"},
	5012: {"CU_FILE_CUDA_POINTER_INVALID", "invalid device pointer"},
	5013: {"CU_FILE_CUDA_MEMORY_TYPE_INVALID", "invalid pointer memory type"},
	5014: {"CU_FILE_CUDA_POINTER_RANGE_ERROR", "pointer range exceeds allocated address range"},
	5015: {"CU_FILE_CUDA_CONTEXT_MISMATCH", "cuda context mismatch"},
	5016: {"CU_FILE_INVALID_MAPPING_SIZE", "access beyond maximum pinned size"},
	5017: {"CU_FILE_INVALID_MAPPING_RANGE", "access beyond mapped size"},
	5018: {"CU_FILE_INVALID_FILE_TYPE", "unsupported file type"},
	5019: {"CU_FILE_INVALID_FILE_OPEN_FLAG", "unsupported file open flags"},
	5020: {"CU_FILE_DIO_NOT_SET", "fd direct IO not set"},
	5022: {"CU_FILE_INVALID_VALUE", "invalid arguments"},
	5023: {"CU_FILE_MEMORY_ALREADY_REGISTERED", "device pointer already registered"},
	5024: {"CU_FILE_MEMORY_NOT_REGISTERED", "device pointer lookup failure"},
	5025: {"CU_FILE_PERMISSION_DENIED", "driver or file access error"},
	5026: {"CU_FILE_DRIVER_ALREADY_OPEN", "driver is already open"},
	5027: {"CU_FILE_HANDLE_NOT_REGISTERED", "file descriptor is not registered"},
	5028: {"CU_FILE_HANDLE_ALREADY_REGISTERED", "file descriptor is already registered"},
	5029: {"CU_FILE_DEVICE_NOT_FOUND", "GPU device not found"},
	5030: {"CU_FILE_INTERNAL_ERROR", "internal error"},
	5031: {"CU_FILE_GETNEWFD_FAILED", "failed to obtain new file descriptor"},
	5033: {"CU_FILE_NVFS_SETUP_ERROR", "NVFS driver initialization error"},
	5034: {"CU_FILE_IO_DISABLED", "GPUDirect Storage disabled by config on current file"},
	5035: {"CU_FILE_BATCH_SUBMIT_FAILED", "failed to submit batch operation"},
	5036: {"CU_FILE_GPU_MEMORY_PINNING_FAILED", "failed to allocate pinned GPU memory"},
	5037: {"CU_FILE_BATCH_FULL", "queue full for batch operation"},
	5038: {"CU_FILE_ASYNC_NOT_SUPPORTED", "cuFile stream operation not supported"},
	5039: {"CU_FILE_INTERNAL_BATCH_SETUP_ERROR", "batch setup internal error - retry later"},
	5040: {"CU_FILE_INTERNAL_BATCH_SUBMIT_ERROR", "batch submit internal error - retry later"},
	5041: {"CU_FILE_INTERNAL_BATCH_GETSTATUS_ERROR", "batch get status internal error - retry later"},
	5042: {"CU_FILE_INTERNAL_BATCH_CANCEL_ERROR", "batch cancel internal error - retry later"},
	5043: {"CU_FILE_NOMEM_ERROR", "cufile no memory error - retry later"},
	5044: {"CU_FILE_IO_ERROR", "cufile io error"},
	5045: {"CU_FILE_INTERNAL_BUF_REGISTER_ERROR", "cufile buf registration error"},
	5046: {"CU_FILE_HASH_OPR_ERROR", "cufile hash operation error"},
	5047: {"CU_FILE_INVALID_CONTEXT_ERROR", "cufile invalid context error"},
	5048: {"CU_FILE_NVFS_INTERNAL_DRIVER_ERROR", "nvfs internal driver error"},
	5049: {"CU_FILE_BATCH_NOCOMPAT_ERROR", "compat mode off error"},
	5050: {"CU_FILE_IO_MAX_ERROR", "GPUDirect Storage max error"},
}

// cufileStatusText is "NAME (code): description".
func cufileStatusText(code int) string {
	if s, ok := cufileStatus[code]; ok {
		return fmt.Sprintf("%s (%d): %s", s[0], code, s[1])
	}
	return fmt.Sprintf("unknown cuFile status (%d)", code)
}

// readError explains a negative cuFileRead result: -1 with errno for a file
// system error, otherwise minus a CUfileOpError (or, from older libraries,
// minus an errno).
func readError(ret int64, errno syscall.Errno, cuCode int) error {
	if ret == -1 {
		if errno == 0 {
			errno = syscall.EIO
		}
		return fmt.Errorf("cuFileRead: %w", errno)
	}
	code := int(-ret)
	if code > 5000 {
		return &cuFileError{op: "cuFileRead", code: code, cuCode: cuCode}
	}
	return fmt.Errorf("cuFileRead: %w", syscall.Errno(code))
}

// errClosed is returned by methods of a closed Device, Region or handle.
var errClosed = errors.New("cuda: use after close or free")
