/*
 * shim.h: the few CUDA driver and cuFile types and constants gdsfs uses,
 * declared here so the package builds with no CUDA toolkit installed, and
 * the prototypes of the C shim (shim.c) that loads libcuda.so.1 and
 * libcufile.so.0 with dlopen and calls them.
 *
 * Every layout and value below was checked against public copies of the
 * real headers (see the _Static_assert block for the sources). Enum-typed
 * fields are declared as int: C enums whose values fit in an int are 4
 * bytes on every ABI CUDA supports, and the asserts pin the sizes.
 */
#ifndef GDSFS_CUDA_SHIM_H
#define GDSFS_CUDA_SHIM_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* ---- cuda.h ---------------------------------------------------------- */

typedef int CUresult; /* enum cudaError_enum */
typedef int CUdevice; /* CUdevice_v1 */
typedef unsigned long long CUdeviceptr; /* CUdeviceptr_v2, LP64 */
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef unsigned long long CUmemGenericAllocationHandle;

typedef struct CUuuid_st {
	char bytes[16];
} CUuuid;

typedef struct CUmemLocation_st {
	int type; /* CUmemLocationType */
	int id;
} CUmemLocation;

typedef struct CUmemAllocationProp_st {
	int type;                 /* CUmemAllocationType */
	int requestedHandleTypes; /* CUmemAllocationHandleType */
	CUmemLocation location;
	void *win32HandleMetaData;
	struct {
		unsigned char compressionType;
		unsigned char gpuDirectRDMACapable;
		unsigned short usage;
		unsigned char reserved[4];
	} allocFlags;
} CUmemAllocationProp;

typedef struct CUmemAccessDesc_st {
	CUmemLocation location;
	int flags; /* CUmemAccess_flags */
} CUmemAccessDesc;

#define GDS_CUDA_SUCCESS 0
#define GDS_CUDA_ERROR_OUT_OF_MEMORY 2
#define GDS_CUDA_ERROR_NO_DEVICE 100
#define GDS_CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED 704
#define GDS_CUDA_ERROR_NOT_SUPPORTED 801
#define GDS_CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK 0x01
#define GDS_CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED 0x02
#define GDS_CU_MEM_ALLOCATION_TYPE_PINNED 0x1
#define GDS_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR 0x1
#define GDS_CU_MEM_LOCATION_TYPE_DEVICE 0x1
#define GDS_CU_MEM_ACCESS_FLAGS_PROT_READWRITE 0x3
#define GDS_CU_MEM_ALLOC_GRANULARITY_RECOMMENDED 0x1
#define GDS_CU_STREAM_NON_BLOCKING 0x1
#define GDS_CU_EVENT_DISABLE_TIMING 0x2
#define GDS_CU_MEMHOSTALLOC_PORTABLE 0x01
#define GDS_CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED 110

/* ---- cufile.h -------------------------------------------------------- */

typedef struct CUfileError {
	int err;         /* CUfileOpError */
	CUresult cu_err; /* set when err == CU_FILE_CUDA_DRIVER_ERROR */
} CUfileError_t;

typedef struct CUfileDescr_t {
	int type; /* enum CUfileFileHandleType */
	union {
		int fd;
		void *handle;
	} handle;
	const void *fs_ops; /* const CUfileFSOps_t *, NULL for plain files */
} CUfileDescr_t;

typedef void *CUfileHandle_t;

#define GDS_CU_FILE_SUCCESS 0
#define GDS_CUFILEOP_BASE_ERR 5000
#define GDS_CU_FILE_CUDA_DRIVER_ERROR 5011
#define GDS_CU_FILE_HANDLE_TYPE_OPAQUE_FD 1

/* Statistics (cuFileSetStatsLevel, cuFileGetStatsL1..L3). The layout is
 * NVIDIA's cufile.h as published in the cuFile API reference ("cuFile
 * stats APIs") and in NVIDIA/cuda-python cycufile.pxd, generated from
 * cufile.h "12.9.1 to 13.4.0" (libcufile 1.14 to 1.17): every field is
 * declared, in order, though gdsfs reads only a few. */
#define GDS_CUFILE_GPU_UUID_LEN 16
#define GDS_CUFILE_STATS_MAX_GPUS 16

typedef struct CUfileOpCounter {
	uint64_t ok;
	uint64_t err;
} CUfileOpCounter_t;

typedef struct CUfileStatsLevel1 {
	CUfileOpCounter_t read_ops;
	CUfileOpCounter_t write_ops;
	CUfileOpCounter_t hdl_register_ops;
	CUfileOpCounter_t hdl_deregister_ops;
	CUfileOpCounter_t buf_register_ops;
	CUfileOpCounter_t buf_deregister_ops;
	uint64_t read_bytes;
	uint64_t write_bytes;
	uint64_t read_bw_bytes_per_sec;
	uint64_t write_bw_bytes_per_sec;
	uint64_t read_lat_avg_us;
	uint64_t write_lat_avg_us;
	uint64_t read_ops_per_sec;
	uint64_t write_ops_per_sec;
	uint64_t read_lat_sum_us;
	uint64_t write_lat_sum_us;
	CUfileOpCounter_t batch_submit_ops;
	CUfileOpCounter_t batch_complete_ops;
	CUfileOpCounter_t batch_setup_ops;
	CUfileOpCounter_t batch_cancel_ops;
	CUfileOpCounter_t batch_destroy_ops;
	CUfileOpCounter_t batch_enqueued_ops;
	CUfileOpCounter_t batch_posix_enqueued_ops;
	CUfileOpCounter_t batch_processed_ops;
	CUfileOpCounter_t batch_posix_processed_ops;
	CUfileOpCounter_t batch_nvfs_submit_ops;
	CUfileOpCounter_t batch_p2p_submit_ops;
	CUfileOpCounter_t batch_aio_submit_ops;
	CUfileOpCounter_t batch_iouring_submit_ops;
	CUfileOpCounter_t batch_mixed_io_submit_ops;
	CUfileOpCounter_t batch_total_submit_ops;
	uint64_t batch_read_bytes;
	uint64_t batch_write_bytes;
	uint64_t batch_read_bw_bytes;
	uint64_t batch_write_bw_bytes;
	uint64_t batch_submit_lat_avg_us;
	uint64_t batch_completion_lat_avg_us;
	uint64_t batch_submit_ops_per_sec;
	uint64_t batch_complete_ops_per_sec;
	uint64_t batch_submit_lat_sum_us;
	uint64_t batch_completion_lat_sum_us;
	uint64_t last_batch_read_bytes;
	uint64_t last_batch_write_bytes;
} CUfileStatsLevel1_t;

typedef struct CUfileStatsLevel2 {
	CUfileStatsLevel1_t basic;
	uint64_t read_size_kb_hist[32];
	uint64_t write_size_kb_hist[32];
} CUfileStatsLevel2_t;

typedef struct CUfilePerGpuStats {
	char uuid[GDS_CUFILE_GPU_UUID_LEN];
	uint64_t read_bytes;
	uint64_t read_bw_bytes_per_sec;
	uint64_t read_utilization;
	uint64_t read_duration_us;
	uint64_t n_total_reads;
	uint64_t n_p2p_reads;
	uint64_t n_nvfs_reads;
	uint64_t n_posix_reads;
	uint64_t n_unaligned_reads;
	uint64_t n_dr_reads;
	uint64_t n_sparse_regions;
	uint64_t n_inline_regions;
	uint64_t n_reads_err;
	uint64_t writes_bytes;
	uint64_t write_bw_bytes_per_sec;
	uint64_t write_utilization;
	uint64_t write_duration_us;
	uint64_t n_total_writes;
	uint64_t n_p2p_writes;
	uint64_t n_nvfs_writes;
	uint64_t n_posix_writes;
	uint64_t n_unaligned_writes;
	uint64_t n_dr_writes;
	uint64_t n_writes_err;
	uint64_t n_mmap;
	uint64_t n_mmap_ok;
	uint64_t n_mmap_err;
	uint64_t n_mmap_free;
	uint64_t reg_bytes;
} CUfilePerGpuStats_t;

typedef struct CUfileStatsLevel3 {
	CUfileStatsLevel2_t detailed;
	uint32_t num_gpus;
	CUfilePerGpuStats_t per_gpu_stats[GDS_CUFILE_STATS_MAX_GPUS];
} CUfileStatsLevel3_t;

/*
 * Layout checks. Sources read (public copies, via code search):
 *  - cuda.h (CUDA 11.6) as vendored in several repositories: the _v2 #define
 *    block, CUuuid_st, CUresult values (OUT_OF_MEMORY = 2, NO_DEVICE = 100),
 *    CU_STREAM_NON_BLOCKING = 0x1, CU_EVENT_DISABLE_TIMING = 0x2,
 *    CU_MEMHOSTALLOC_PORTABLE = 0x01.
 *  - NVIDIA/cuda-python cuda_bindings/cuda/bindings/cydriver.pxd, generated
 *    "across versions from 12.9.0 to 13.3.0": CUmemLocation_st {type, id},
 *    CUmemAllocationProp_st {type, requestedHandleTypes, location,
 *    win32HandleMetaData, allocFlags{u8, u8, u16, u8[4]}},
 *    CUmemAccessDesc_st {location, flags}; an older cydriver.pxd with enum
 *    values: CU_MEM_ALLOCATION_TYPE_PINNED = 1,
 *    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1,
 *    CU_MEM_LOCATION_TYPE_DEVICE = 1, CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3,
 *    CU_MEM_ALLOC_GRANULARITY_RECOMMENDED = 1,
 *    CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED = 110, and
 *    every prototype used in shim.c.
 *  - cufile.h (NVIDIA, 2023, with CUFILEOP_STATUS_ENTRIES) and
 *    NVIDIA/cuda-python cuda_bindings/cuda/bindings/cycufile.pxd ("12.9.1 to
 *    13.4.0"): CUfileError {CUfileOpError err; CUresult cu_err},
 *    CUfileDescr_t {enum type; union {int fd; void *handle}; const
 *    CUfileFSOps_t *fs_ops}, CU_FILE_HANDLE_TYPE_OPAQUE_FD = 1, status codes
 *    CUFILEOP_BASE_ERR + n, and the cuFile prototypes used in shim.c.
 */
_Static_assert(sizeof(CUdeviceptr) == 8, "CUdeviceptr is 64-bit");
_Static_assert(sizeof(CUmemGenericAllocationHandle) == 8, "handle is 64-bit");
_Static_assert(sizeof(CUuuid) == 16, "CUuuid is 16 bytes");
_Static_assert(sizeof(CUmemLocation) == 8, "CUmemLocation is {int, int}");
_Static_assert(sizeof(CUmemAllocationProp) == 32, "CUmemAllocationProp size");
_Static_assert(offsetof(CUmemAllocationProp, requestedHandleTypes) == 4, "prop.requestedHandleTypes");
_Static_assert(offsetof(CUmemAllocationProp, location) == 8, "prop.location");
_Static_assert(offsetof(CUmemAllocationProp, win32HandleMetaData) == 16, "prop.win32HandleMetaData");
_Static_assert(offsetof(CUmemAllocationProp, allocFlags) == 24, "prop.allocFlags");
_Static_assert(sizeof(CUmemAccessDesc) == 12, "CUmemAccessDesc size");
_Static_assert(offsetof(CUmemAccessDesc, flags) == 8, "CUmemAccessDesc.flags");
_Static_assert(sizeof(CUfileError_t) == 8, "CUfileError_t is {int, int}");
_Static_assert(sizeof(CUfileDescr_t) == 24, "CUfileDescr_t size");
_Static_assert(offsetof(CUfileDescr_t, handle) == 8, "CUfileDescr_t.handle");
_Static_assert(offsetof(CUfileDescr_t, fs_ops) == 16, "CUfileDescr_t.fs_ops");
_Static_assert(sizeof(CUfileOpCounter_t) == 16, "CUfileOpCounter_t is {u64, u64}");
_Static_assert(sizeof(CUfileStatsLevel1_t) == 512, "CUfileStatsLevel1_t: 21 counters, 22 u64");
_Static_assert(offsetof(CUfileStatsLevel1_t, read_bytes) == 96, "L1.read_bytes");
_Static_assert(offsetof(CUfileStatsLevel1_t, batch_submit_ops) == 176, "L1.batch_submit_ops");
_Static_assert(offsetof(CUfileStatsLevel1_t, batch_read_bytes) == 416, "L1.batch_read_bytes");
_Static_assert(sizeof(CUfileStatsLevel2_t) == 1024, "CUfileStatsLevel2_t: L1 and two 32-bucket histograms");
_Static_assert(sizeof(CUfilePerGpuStats_t) == 248, "CUfilePerGpuStats_t: uuid[16] and 29 u64");
_Static_assert(offsetof(CUfilePerGpuStats_t, read_bytes) == 16, "per-GPU read_bytes");
_Static_assert(offsetof(CUfilePerGpuStats_t, n_nvfs_reads) == 64, "per-GPU n_nvfs_reads");
_Static_assert(offsetof(CUfilePerGpuStats_t, n_posix_reads) == 72, "per-GPU n_posix_reads");
_Static_assert(offsetof(CUfilePerGpuStats_t, n_reads_err) == 112, "per-GPU n_reads_err");
_Static_assert(offsetof(CUfileStatsLevel3_t, num_gpus) == 1024, "L3.num_gpus");
_Static_assert(offsetof(CUfileStatsLevel3_t, per_gpu_stats) == 1032, "L3.per_gpu_stats");
_Static_assert(sizeof(CUfileStatsLevel3_t) == 5000, "CUfileStatsLevel3_t size");
_Static_assert(sizeof(off_t) == 8, "off_t is 64-bit (cuFileRead offsets)");

/* ---- loading --------------------------------------------------------- */

/* gds_cuda_load dlopens libcuda.so.1 and resolves every symbol gdsfs uses.
 * It returns 0, or -1 with a message in err. */
int gds_cuda_load(char *err, size_t errlen);
/* gds_cufile_load dlopens path (a name or a full path) as libcufile. */
int gds_cufile_load(const char *path, char *err, size_t errlen);
/* gds_lib_path writes the file a loaded library came from (0 = libcuda,
 * 1 = libcufile) into buf; it returns -1 when it cannot tell. */
int gds_lib_path(int which, char *buf, size_t buflen);
int gds_cufile_has_version(void);
/* gds_cufile_has_stats returns 1 when libcufile exports the statistics
 * entry points, else 0 with the first missing one's name in err. */
int gds_cufile_has_stats(char *err, size_t errlen);

/* ---- driver, devices, contexts (no context needed) -------------------- */

CUresult gds_init(void);
CUresult gds_driver_version(int *v);
CUresult gds_device_count(int *n);
CUresult gds_device_get(int ordinal, CUdevice *dev);
CUresult gds_device_uuid(CUdevice dev, CUuuid *uuid);
CUresult gds_device_name(CUdevice dev, char *buf, int len);
CUresult gds_device_total_mem(CUdevice dev, size_t *bytes);
CUresult gds_device_attr(CUdevice dev, int attr, int *v);
CUresult gds_ctx_retain(CUdevice dev, CUcontext *ctx);
CUresult gds_ctx_release(CUdevice dev);
/* gds_error_name returns the CUresult's name, or NULL when unknown. */
const char *gds_error_name(CUresult r);

/* ---- memory (each sets ctx current first) ----------------------------- */

CUresult gds_mem_info(CUcontext ctx, size_t *free_b, size_t *total_b);
/* rdma sets allocFlags.gpuDirectRDMACapable (needed by nvidia-fs DMA). */
CUresult gds_granularity(CUcontext ctx, CUdevice dev, int rdma, size_t *g);
CUresult gds_mem_create(CUcontext ctx, CUdevice dev, int rdma, size_t size, CUmemGenericAllocationHandle *h);
CUresult gds_mem_release(CUcontext ctx, CUmemGenericAllocationHandle h);
CUresult gds_va_reserve(CUcontext ctx, size_t size, CUdeviceptr *ptr);
CUresult gds_va_free(CUcontext ctx, CUdeviceptr ptr, size_t size);
CUresult gds_mem_map(CUcontext ctx, CUdeviceptr ptr, size_t size, CUmemGenericAllocationHandle h);
CUresult gds_mem_unmap(CUcontext ctx, CUdeviceptr ptr, size_t size);
CUresult gds_mem_set_access(CUcontext ctx, CUdevice dev, CUdeviceptr ptr, size_t size);
CUresult gds_mem_export_fd(CUcontext ctx, CUmemGenericAllocationHandle h, int *fd);
/* gds_mem_import_fd imports an exported POSIX fd as a new handle; the fd
 * stays open. */
CUresult gds_mem_import_fd(CUcontext ctx, int fd, CUmemGenericAllocationHandle *h);
CUresult gds_copy_dtod(CUcontext ctx, CUdeviceptr dst, CUdeviceptr src, size_t n);
CUresult gds_memset_zero(CUcontext ctx, CUdeviceptr dst, size_t n);
CUresult gds_copy_dtoh(CUcontext ctx, void *dst, CUdeviceptr src, size_t n);

/* ---- peers (two devices of one process) ------------------------------ */

CUresult gds_can_access_peer(CUdevice dev, CUdevice peer, int *can);
/* gds_p2p_attr is cuDeviceGetP2PAttribute (src != dst), or
 * CUDA_ERROR_NOT_SUPPORTED where the driver lacks it. */
CUresult gds_p2p_attr(CUdevice src, CUdevice dst, int attr, int *v);
/* gds_enable_peer lets ctx's device reach peer's allocations
 * (cuCtxEnablePeerAccess); already enabled is success. */
CUresult gds_enable_peer(CUcontext ctx, CUcontext peer);
/* gds_copy_peer copies n bytes from src (src_ctx's device) to dst
 * (dst_ctx's device; the same context is allowed) with cuMemcpyPeerAsync
 * on a stream of dst_ctx, and waits for it. */
CUresult gds_copy_peer(CUcontext dst_ctx, CUdeviceptr dst, CUcontext src_ctx, CUdeviceptr src, size_t n);

/* ---- NVML (nvml.c): NVLinks between two GPUs, where libnvidia-ml loads - */

/* gds_nvml_links counts the active NVLinks of the GPU named uuid_a
 * ("GPU-...") that reach the GPU named uuid_b directly, and those of each
 * that reach an NVSwitch; nvlink_p2p is nvmlDeviceGetP2PStatus(NVLINK) ==
 * OK. It returns 0, or -1 with a message in err (NVML missing or failing). */
int gds_nvml_links(const char *uuid_a, const char *uuid_b, int *direct, int *switch_a, int *switch_b,
		   int *nvlink_p2p, char *err, size_t errlen);

/* ---- pipes: two pinned host buffers, one stream, two events ----------- */

struct gds_pipe {
	CUstream stream;
	CUevent ev[2];
	void *buf[2];
	size_t size;
};

CUresult gds_pipe_new(CUcontext ctx, size_t size, struct gds_pipe **out);
CUresult gds_pipe_free(CUcontext ctx, struct gds_pipe *p);
/* gds_pipe_htod starts copying buf[i][:n] to dst and records ev[i]. */
CUresult gds_pipe_htod(CUcontext ctx, struct gds_pipe *p, int i, CUdeviceptr dst, size_t n);
CUresult gds_pipe_wait(CUcontext ctx, struct gds_pipe *p, int i);
/* gds_pipe_dtoh copies n device bytes to dst through both buffers in turn,
 * overlapping each device-to-host copy with the host copy of the last. */
CUresult gds_pipe_dtoh(CUcontext ctx, struct gds_pipe *p, void *dst, CUdeviceptr src, size_t n);

/* ---- cuFile (each sets ctx current first) ----------------------------- */

CUfileError_t gds_cufile_driver_open(CUcontext ctx);
CUfileError_t gds_cufile_driver_close(CUcontext ctx);
CUfileError_t gds_cufile_version(int *v);
CUfileError_t gds_cufile_register(CUcontext ctx, int fd, CUfileHandle_t *fh);
void gds_cufile_deregister(CUcontext ctx, CUfileHandle_t fh);
CUfileError_t gds_cufile_buf_register(CUcontext ctx, CUdeviceptr base, size_t n);
CUfileError_t gds_cufile_buf_deregister(CUcontext ctx, CUdeviceptr base);
/* gds_cufile_stats_start sets the statistics level and starts counting
 * (cuFileSetStatsLevel, cuFileStatsStart). */
CUfileError_t gds_cufile_stats_start(int level);
/* gds_cufile_stats reads level 1 into *l1 and, when level is 3, level 3
 * into *l3 (its per-GPU part). */
CUfileError_t gds_cufile_stats(int level, CUfileStatsLevel1_t *l1, CUfileStatsLevel3_t *l3);
/* gds_cufile_read returns cuFileRead's result; when it is -1, *errnum holds
 * errno; when setting the context failed it returns -5011 and *cuerr. */
ssize_t gds_cufile_read(CUcontext ctx, CUfileHandle_t fh, CUdeviceptr base, size_t n,
			off_t file_off, off_t buf_off, int *errnum, int *cuerr);

#endif
