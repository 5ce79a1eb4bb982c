//go:build cgo

/*
 * shim.c: loads libcuda.so.1 and libcufile.so.0 with dlopen, resolves the
 * entry points gdsfs uses (the _v2 ones where they exist), and wraps each
 * call. Every wrapper that works on device memory, streams or cuFile sets
 * the caller's context current first, inside the same C call: goroutines
 * move between OS threads, and a context is current per thread.
 *
 * Prototypes were checked against NVIDIA/cuda-python cydriver.pxd and
 * cycufile.pxd and copies of cuda.h / cufile.h (see shim.h).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shim.h"

static struct {
	void *lib;
	CUresult (*Init)(unsigned int flags);
	CUresult (*DriverGetVersion)(int *v);
	CUresult (*DeviceGetCount)(int *n);
	CUresult (*DeviceGet)(CUdevice *dev, int ordinal);
	CUresult (*DeviceGetUuid)(CUuuid *uuid, CUdevice dev);
	CUresult (*DeviceGetName)(char *name, int len, CUdevice dev);
	CUresult (*DeviceTotalMem)(size_t *bytes, CUdevice dev);
	CUresult (*DeviceGetAttribute)(int *v, int attr, CUdevice dev);
	CUresult (*DevicePrimaryCtxRetain)(CUcontext *ctx, CUdevice dev);
	CUresult (*DevicePrimaryCtxRelease)(CUdevice dev);
	CUresult (*CtxSetCurrent)(CUcontext ctx);
	CUresult (*GetErrorName)(CUresult r, const char **s);
	CUresult (*MemGetInfo)(size_t *free_b, size_t *total_b);
	CUresult (*MemGetAllocationGranularity)(size_t *g, const CUmemAllocationProp *prop, int option);
	CUresult (*MemCreate)(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop,
			      unsigned long long flags);
	CUresult (*MemRelease)(CUmemGenericAllocationHandle h);
	CUresult (*MemAddressReserve)(CUdeviceptr *ptr, size_t size, size_t align, CUdeviceptr addr,
				      unsigned long long flags);
	CUresult (*MemAddressFree)(CUdeviceptr ptr, size_t size);
	CUresult (*MemMap)(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle h,
			   unsigned long long flags);
	CUresult (*MemUnmap)(CUdeviceptr ptr, size_t size);
	CUresult (*MemSetAccess)(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count);
	CUresult (*MemExportToShareableHandle)(void *out, CUmemGenericAllocationHandle h, int type,
					       unsigned long long flags);
	CUresult (*MemImportFromShareableHandle)(CUmemGenericAllocationHandle *h, void *os_handle, int type);
	CUresult (*MemHostAlloc)(void **p, size_t size, unsigned int flags);
	CUresult (*MemFreeHost)(void *p);
	CUresult (*MemcpyHtoDAsync)(CUdeviceptr dst, const void *src, size_t n, CUstream s);
	CUresult (*MemcpyDtoHAsync)(void *dst, CUdeviceptr src, size_t n, CUstream s);
	CUresult (*MemcpyDtoH)(void *dst, CUdeviceptr src, size_t n);
	CUresult (*MemcpyDtoD)(CUdeviceptr dst, CUdeviceptr src, size_t n);
	CUresult (*MemsetD8)(CUdeviceptr dst, unsigned char uc, size_t n);
	CUresult (*StreamCreate)(CUstream *s, unsigned int flags);
	CUresult (*StreamDestroy)(CUstream s);
	CUresult (*StreamSynchronize)(CUstream s);
	CUresult (*EventCreate)(CUevent *e, unsigned int flags);
	CUresult (*EventDestroy)(CUevent e);
	CUresult (*EventRecord)(CUevent e, CUstream s);
	CUresult (*EventSynchronize)(CUevent e);
	CUresult (*DeviceCanAccessPeer)(int *can, CUdevice dev, CUdevice peer);
	CUresult (*DeviceGetP2PAttribute)(int *v, int attr, CUdevice src, CUdevice dst); /* optional */
	CUresult (*CtxEnablePeerAccess)(CUcontext peer, unsigned int flags);
	CUresult (*MemcpyPeerAsync)(CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src, CUcontext src_ctx, size_t n,
				    CUstream s);
} cu;

static struct {
	void *lib;
	CUfileError_t (*DriverOpen)(void);
	CUfileError_t (*DriverClose)(void);
	CUfileError_t (*GetVersion)(int *v);
	CUfileError_t (*HandleRegister)(CUfileHandle_t *fh, CUfileDescr_t *descr);
	void (*HandleDeregister)(CUfileHandle_t fh);
	CUfileError_t (*BufRegister)(const void *base, size_t n, int flags);
	CUfileError_t (*BufDeregister)(const void *base);
	ssize_t (*Read)(CUfileHandle_t fh, void *base, size_t n, off_t file_off, off_t buf_off);
	/* Optional: the statistics API (libcufile 1.14 and later). */
	CUfileError_t (*SetStatsLevel)(int level);
	CUfileError_t (*StatsStart)(void);
	CUfileError_t (*GetStatsL1)(CUfileStatsLevel1_t *s);
	CUfileError_t (*GetStatsL3)(CUfileStatsLevel3_t *s);
} cf;

/* sym resolves the first of names[] that lib exports into *out. */
static int sym(void *lib, const char *const *names, void **out, const char *libname, char *err, size_t errlen)
{
	for (int i = 0; names[i] != NULL; i++) {
		void *p = dlsym(lib, names[i]);
		if (p != NULL) {
			*out = p;
			return 0;
		}
	}
	if (err != NULL)
		snprintf(err, errlen, "%s: symbol %s not found", libname, names[0]);
	return -1;
}

#define NAMES(...) ((const char *const[]){__VA_ARGS__, NULL})
#define REQ(tbl, field, libname, ...) \
	if (sym(tbl.lib, NAMES(__VA_ARGS__), (void **)&tbl.field, libname, err, errlen) != 0) goto fail

int gds_cuda_load(char *err, size_t errlen)
{
	if (cu.lib != NULL)
		return 0;
	dlerror();
	cu.lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (cu.lib == NULL) {
		const char *e = dlerror();
		snprintf(err, errlen, "dlopen libcuda.so.1: %s", e ? e : "unknown error");
		return -1;
	}
	const char *L = "libcuda.so.1";
	REQ(cu, Init, L, "cuInit");
	REQ(cu, DriverGetVersion, L, "cuDriverGetVersion");
	REQ(cu, DeviceGetCount, L, "cuDeviceGetCount");
	REQ(cu, DeviceGet, L, "cuDeviceGet");
	REQ(cu, DeviceGetUuid, L, "cuDeviceGetUuid_v2", "cuDeviceGetUuid");
	REQ(cu, DeviceGetName, L, "cuDeviceGetName");
	REQ(cu, DeviceTotalMem, L, "cuDeviceTotalMem_v2");
	REQ(cu, DeviceGetAttribute, L, "cuDeviceGetAttribute");
	REQ(cu, DevicePrimaryCtxRetain, L, "cuDevicePrimaryCtxRetain");
	REQ(cu, DevicePrimaryCtxRelease, L, "cuDevicePrimaryCtxRelease_v2");
	REQ(cu, CtxSetCurrent, L, "cuCtxSetCurrent");
	REQ(cu, GetErrorName, L, "cuGetErrorName");
	REQ(cu, MemGetInfo, L, "cuMemGetInfo_v2");
	REQ(cu, MemGetAllocationGranularity, L, "cuMemGetAllocationGranularity");
	REQ(cu, MemCreate, L, "cuMemCreate");
	REQ(cu, MemRelease, L, "cuMemRelease");
	REQ(cu, MemAddressReserve, L, "cuMemAddressReserve");
	REQ(cu, MemAddressFree, L, "cuMemAddressFree");
	REQ(cu, MemMap, L, "cuMemMap");
	REQ(cu, MemUnmap, L, "cuMemUnmap");
	REQ(cu, MemSetAccess, L, "cuMemSetAccess");
	REQ(cu, MemExportToShareableHandle, L, "cuMemExportToShareableHandle");
	REQ(cu, MemImportFromShareableHandle, L, "cuMemImportFromShareableHandle");
	REQ(cu, MemHostAlloc, L, "cuMemHostAlloc");
	REQ(cu, MemFreeHost, L, "cuMemFreeHost");
	REQ(cu, MemcpyHtoDAsync, L, "cuMemcpyHtoDAsync_v2");
	REQ(cu, MemcpyDtoHAsync, L, "cuMemcpyDtoHAsync_v2");
	REQ(cu, MemcpyDtoH, L, "cuMemcpyDtoH_v2");
	REQ(cu, MemcpyDtoD, L, "cuMemcpyDtoD_v2");
	REQ(cu, MemsetD8, L, "cuMemsetD8_v2");
	REQ(cu, StreamCreate, L, "cuStreamCreate");
	REQ(cu, StreamDestroy, L, "cuStreamDestroy_v2");
	REQ(cu, StreamSynchronize, L, "cuStreamSynchronize");
	REQ(cu, EventCreate, L, "cuEventCreate");
	REQ(cu, EventDestroy, L, "cuEventDestroy_v2");
	REQ(cu, EventRecord, L, "cuEventRecord");
	REQ(cu, EventSynchronize, L, "cuEventSynchronize");
	REQ(cu, DeviceCanAccessPeer, L, "cuDeviceCanAccessPeer");
	REQ(cu, CtxEnablePeerAccess, L, "cuCtxEnablePeerAccess");
	REQ(cu, MemcpyPeerAsync, L, "cuMemcpyPeerAsync");
	/* Optional: cuDeviceGetP2PAttribute is newer than the rest. */
	sym(cu.lib, NAMES("cuDeviceGetP2PAttribute"), (void **)&cu.DeviceGetP2PAttribute, L, NULL, 0);
	return 0;
fail:
	dlclose(cu.lib);
	memset(&cu, 0, sizeof(cu));
	return -1;
}

int gds_cufile_load(const char *path, char *err, size_t errlen)
{
	if (cf.lib != NULL)
		return 0;
	dlerror();
	cf.lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (cf.lib == NULL) {
		const char *e = dlerror();
		snprintf(err, errlen, "%s", e ? e : "unknown error");
		return -1;
	}
	const char *L = "libcufile.so.0";
	REQ(cf, DriverOpen, L, "cuFileDriverOpen");
	REQ(cf, DriverClose, L, "cuFileDriverClose_v2", "cuFileDriverClose");
	REQ(cf, HandleRegister, L, "cuFileHandleRegister");
	REQ(cf, HandleDeregister, L, "cuFileHandleDeregister");
	REQ(cf, BufRegister, L, "cuFileBufRegister");
	REQ(cf, BufDeregister, L, "cuFileBufDeregister");
	REQ(cf, Read, L, "cuFileRead");
	/* Optional: cuFileGetVersion is newer than the rest. */
	sym(cf.lib, NAMES("cuFileGetVersion"), (void **)&cf.GetVersion, L, NULL, 0);
	sym(cf.lib, NAMES("cuFileSetStatsLevel"), (void **)&cf.SetStatsLevel, L, NULL, 0);
	sym(cf.lib, NAMES("cuFileStatsStart"), (void **)&cf.StatsStart, L, NULL, 0);
	sym(cf.lib, NAMES("cuFileGetStatsL1"), (void **)&cf.GetStatsL1, L, NULL, 0);
	sym(cf.lib, NAMES("cuFileGetStatsL3"), (void **)&cf.GetStatsL3, L, NULL, 0);
	return 0;
fail:
	dlclose(cf.lib);
	memset(&cf, 0, sizeof(cf));
	return -1;
}

int gds_lib_path(int which, char *buf, size_t buflen)
{
	void *p = which == 0 ? (void *)cu.Init : (void *)cf.DriverOpen;
	Dl_info info;
	if (p == NULL || dladdr(p, &info) == 0 || info.dli_fname == NULL)
		return -1;
	snprintf(buf, buflen, "%s", info.dli_fname);
	return 0;
}

int gds_cufile_has_version(void) { return cf.GetVersion != NULL; }

int gds_cufile_has_stats(char *err, size_t errlen)
{
	const char *missing = cf.SetStatsLevel == NULL ? "cuFileSetStatsLevel"
			      : cf.StatsStart == NULL  ? "cuFileStatsStart"
			      : cf.GetStatsL1 == NULL  ? "cuFileGetStatsL1"
			      : cf.GetStatsL3 == NULL  ? "cuFileGetStatsL3"
						       : NULL;
	if (missing == NULL)
		return 1;
	snprintf(err, errlen, "libcufile.so.0 has no %s", missing);
	return 0;
}

/* ---- driver, devices, contexts ---------------------------------------- */

CUresult gds_init(void) { return cu.Init(0); }
CUresult gds_driver_version(int *v) { return cu.DriverGetVersion(v); }
CUresult gds_device_count(int *n) { return cu.DeviceGetCount(n); }
CUresult gds_device_get(int ordinal, CUdevice *dev) { return cu.DeviceGet(dev, ordinal); }
CUresult gds_device_uuid(CUdevice dev, CUuuid *uuid) { return cu.DeviceGetUuid(uuid, dev); }
CUresult gds_device_name(CUdevice dev, char *buf, int len) { return cu.DeviceGetName(buf, len, dev); }
CUresult gds_device_total_mem(CUdevice dev, size_t *bytes) { return cu.DeviceTotalMem(bytes, dev); }
CUresult gds_device_attr(CUdevice dev, int attr, int *v) { return cu.DeviceGetAttribute(v, attr, dev); }
CUresult gds_ctx_retain(CUdevice dev, CUcontext *ctx) { return cu.DevicePrimaryCtxRetain(ctx, dev); }
CUresult gds_ctx_release(CUdevice dev) { return cu.DevicePrimaryCtxRelease(dev); }

const char *gds_error_name(CUresult r)
{
	const char *s = NULL;
	if (cu.GetErrorName == NULL || cu.GetErrorName(r, &s) != GDS_CUDA_SUCCESS)
		return NULL;
	return s;
}

/* ---- memory ----------------------------------------------------------- */

#define SETCTX(ctx)                                          \
	do {                                                 \
		CUresult r_ = cu.CtxSetCurrent(ctx);         \
		if (r_ != GDS_CUDA_SUCCESS)                  \
			return r_;                           \
	} while (0)

static void device_prop(CUdevice dev, int rdma, CUmemAllocationProp *prop)
{
	memset(prop, 0, sizeof(*prop));
	prop->allocFlags.gpuDirectRDMACapable = rdma ? 1 : 0;
	prop->type = GDS_CU_MEM_ALLOCATION_TYPE_PINNED;
	prop->requestedHandleTypes = GDS_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	prop->location.type = GDS_CU_MEM_LOCATION_TYPE_DEVICE;
	prop->location.id = dev;
}

CUresult gds_mem_info(CUcontext ctx, size_t *free_b, size_t *total_b)
{
	SETCTX(ctx);
	return cu.MemGetInfo(free_b, total_b);
}

CUresult gds_granularity(CUcontext ctx, CUdevice dev, int rdma, size_t *g)
{
	CUmemAllocationProp prop;
	SETCTX(ctx);
	device_prop(dev, rdma, &prop);
	return cu.MemGetAllocationGranularity(g, &prop, GDS_CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
}

CUresult gds_mem_create(CUcontext ctx, CUdevice dev, int rdma, size_t size, CUmemGenericAllocationHandle *h)
{
	CUmemAllocationProp prop;
	SETCTX(ctx);
	device_prop(dev, rdma, &prop);
	return cu.MemCreate(h, size, &prop, 0);
}

CUresult gds_mem_release(CUcontext ctx, CUmemGenericAllocationHandle h)
{
	SETCTX(ctx);
	return cu.MemRelease(h);
}

CUresult gds_va_reserve(CUcontext ctx, size_t size, CUdeviceptr *ptr)
{
	SETCTX(ctx);
	return cu.MemAddressReserve(ptr, size, 0, 0, 0);
}

CUresult gds_va_free(CUcontext ctx, CUdeviceptr ptr, size_t size)
{
	SETCTX(ctx);
	return cu.MemAddressFree(ptr, size);
}

CUresult gds_mem_map(CUcontext ctx, CUdeviceptr ptr, size_t size, CUmemGenericAllocationHandle h)
{
	SETCTX(ctx);
	return cu.MemMap(ptr, size, 0, h, 0);
}

CUresult gds_mem_unmap(CUcontext ctx, CUdeviceptr ptr, size_t size)
{
	SETCTX(ctx);
	return cu.MemUnmap(ptr, size);
}

CUresult gds_mem_set_access(CUcontext ctx, CUdevice dev, CUdeviceptr ptr, size_t size)
{
	CUmemAccessDesc desc;
	SETCTX(ctx);
	memset(&desc, 0, sizeof(desc));
	desc.location.type = GDS_CU_MEM_LOCATION_TYPE_DEVICE;
	desc.location.id = dev;
	desc.flags = GDS_CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	return cu.MemSetAccess(ptr, size, &desc, 1);
}

CUresult gds_mem_export_fd(CUcontext ctx, CUmemGenericAllocationHandle h, int *fd)
{
	SETCTX(ctx);
	*fd = -1;
	return cu.MemExportToShareableHandle(fd, h, GDS_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
}

CUresult gds_mem_import_fd(CUcontext ctx, int fd, CUmemGenericAllocationHandle *h)
{
	SETCTX(ctx);
	return cu.MemImportFromShareableHandle(h, (void *)(uintptr_t)fd, GDS_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
}

CUresult gds_copy_dtod(CUcontext ctx, CUdeviceptr dst, CUdeviceptr src, size_t n)
{
	SETCTX(ctx);
	CUresult r = cu.MemcpyDtoD(dst, src, n);
	if (r != GDS_CUDA_SUCCESS)
		return r;
	/* Device-to-device copies return before they finish; wait on the
	 * legacy default stream they ran on. */
	return cu.StreamSynchronize(NULL);
}

CUresult gds_memset_zero(CUcontext ctx, CUdeviceptr dst, size_t n)
{
	SETCTX(ctx);
	CUresult r = cu.MemsetD8(dst, 0, n);
	if (r != GDS_CUDA_SUCCESS)
		return r;
	return cu.StreamSynchronize(NULL);
}

CUresult gds_copy_dtoh(CUcontext ctx, void *dst, CUdeviceptr src, size_t n)
{
	SETCTX(ctx);
	return cu.MemcpyDtoH(dst, src, n);
}

/* ---- peers ------------------------------------------------------------ */

CUresult gds_can_access_peer(CUdevice dev, CUdevice peer, int *can)
{
	*can = 0;
	return cu.DeviceCanAccessPeer(can, dev, peer);
}

CUresult gds_p2p_attr(CUdevice src, CUdevice dst, int attr, int *v)
{
	*v = 0;
	if (cu.DeviceGetP2PAttribute == NULL)
		return GDS_CUDA_ERROR_NOT_SUPPORTED;
	return cu.DeviceGetP2PAttribute(v, attr, src, dst);
}

CUresult gds_enable_peer(CUcontext ctx, CUcontext peer)
{
	SETCTX(ctx);
	CUresult r = cu.CtxEnablePeerAccess(peer, 0);
	return r == GDS_CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED ? GDS_CUDA_SUCCESS : r;
}

CUresult gds_copy_peer(CUcontext dst_ctx, CUdeviceptr dst, CUcontext src_ctx, CUdeviceptr src, size_t n)
{
	CUstream s = NULL;
	SETCTX(dst_ctx);
	CUresult r = cu.StreamCreate(&s, GDS_CU_STREAM_NON_BLOCKING);
	if (r != GDS_CUDA_SUCCESS)
		return r;
	r = cu.MemcpyPeerAsync(dst, dst_ctx, src, src_ctx, n, s);
	CUresult w = cu.StreamSynchronize(s);
	cu.StreamDestroy(s);
	return r != GDS_CUDA_SUCCESS ? r : w;
}

/* ---- pipes ------------------------------------------------------------ */

static void pipe_destroy(struct gds_pipe *p)
{
	if (p->stream != NULL)
		cu.StreamSynchronize(p->stream);
	for (int i = 0; i < 2; i++) {
		if (p->ev[i] != NULL)
			cu.EventDestroy(p->ev[i]);
		if (p->buf[i] != NULL)
			cu.MemFreeHost(p->buf[i]);
	}
	if (p->stream != NULL)
		cu.StreamDestroy(p->stream);
	free(p);
}

CUresult gds_pipe_new(CUcontext ctx, size_t size, struct gds_pipe **out)
{
	SETCTX(ctx);
	struct gds_pipe *p = calloc(1, sizeof(*p));
	if (p == NULL)
		return GDS_CUDA_ERROR_OUT_OF_MEMORY;
	p->size = size;
	CUresult r = cu.StreamCreate(&p->stream, GDS_CU_STREAM_NON_BLOCKING);
	for (int i = 0; i < 2 && r == GDS_CUDA_SUCCESS; i++) {
		r = cu.EventCreate(&p->ev[i], GDS_CU_EVENT_DISABLE_TIMING);
		if (r == GDS_CUDA_SUCCESS)
			r = cu.MemHostAlloc(&p->buf[i], size, GDS_CU_MEMHOSTALLOC_PORTABLE);
	}
	if (r != GDS_CUDA_SUCCESS) {
		pipe_destroy(p);
		return r;
	}
	*out = p;
	return GDS_CUDA_SUCCESS;
}

CUresult gds_pipe_free(CUcontext ctx, struct gds_pipe *p)
{
	SETCTX(ctx);
	pipe_destroy(p);
	return GDS_CUDA_SUCCESS;
}

CUresult gds_pipe_htod(CUcontext ctx, struct gds_pipe *p, int i, CUdeviceptr dst, size_t n)
{
	SETCTX(ctx);
	CUresult r = cu.MemcpyHtoDAsync(dst, p->buf[i], n, p->stream);
	if (r != GDS_CUDA_SUCCESS)
		return r;
	return cu.EventRecord(p->ev[i], p->stream);
}

CUresult gds_pipe_wait(CUcontext ctx, struct gds_pipe *p, int i)
{
	SETCTX(ctx);
	return cu.EventSynchronize(p->ev[i]);
}

static CUresult pipe_dtoh_start(struct gds_pipe *p, int i, CUdeviceptr src, size_t n)
{
	CUresult r = cu.MemcpyDtoHAsync(p->buf[i], src, n, p->stream);
	if (r != GDS_CUDA_SUCCESS)
		return r;
	return cu.EventRecord(p->ev[i], p->stream);
}

CUresult gds_pipe_dtoh(CUcontext ctx, struct gds_pipe *p, void *dst, CUdeviceptr src, size_t n)
{
	SETCTX(ctx);
	char *out = dst;
	size_t piece = p->size;
	size_t pieces = (n + piece - 1) / piece;
	CUresult r = GDS_CUDA_SUCCESS;
	if (pieces > 0)
		r = pipe_dtoh_start(p, 0, src, n < piece ? n : piece);
	for (size_t k = 0; k < pieces && r == GDS_CUDA_SUCCESS; k++) {
		size_t off = k * piece;
		size_t len = n - off < piece ? n - off : piece;
		if (k + 1 < pieces) {
			size_t next = off + piece;
			size_t nlen = n - next < piece ? n - next : piece;
			r = pipe_dtoh_start(p, (int)((k + 1) & 1), src + next, nlen);
			if (r != GDS_CUDA_SUCCESS)
				break;
		}
		r = cu.EventSynchronize(p->ev[k & 1]);
		if (r == GDS_CUDA_SUCCESS)
			memcpy(out + off, p->buf[k & 1], len);
	}
	if (r != GDS_CUDA_SUCCESS)
		cu.StreamSynchronize(p->stream); /* no copy may still land in a buffer */
	return r;
}

/* ---- cuFile ----------------------------------------------------------- */

#define CF_SETCTX(ctx)                                                    \
	do {                                                              \
		CUresult r_ = cu.CtxSetCurrent(ctx);                      \
		if (r_ != GDS_CUDA_SUCCESS) {                             \
			CUfileError_t e_ = {GDS_CU_FILE_CUDA_DRIVER_ERROR, r_}; \
			return e_;                                        \
		}                                                         \
	} while (0)

CUfileError_t gds_cufile_driver_open(CUcontext ctx)
{
	CF_SETCTX(ctx);
	return cf.DriverOpen();
}

CUfileError_t gds_cufile_driver_close(CUcontext ctx)
{
	CF_SETCTX(ctx);
	return cf.DriverClose();
}

CUfileError_t gds_cufile_version(int *v)
{
	*v = 0;
	if (cf.GetVersion == NULL) {
		CUfileError_t e = {GDS_CUFILEOP_BASE_ERR + 22 /* CU_FILE_INVALID_VALUE */, 0};
		return e;
	}
	return cf.GetVersion(v);
}

CUfileError_t gds_cufile_register(CUcontext ctx, int fd, CUfileHandle_t *fh)
{
	CUfileDescr_t descr;
	CF_SETCTX(ctx);
	memset(&descr, 0, sizeof(descr));
	descr.type = GDS_CU_FILE_HANDLE_TYPE_OPAQUE_FD;
	descr.handle.fd = fd;
	descr.fs_ops = NULL;
	return cf.HandleRegister(fh, &descr);
}

void gds_cufile_deregister(CUcontext ctx, CUfileHandle_t fh)
{
	cu.CtxSetCurrent(ctx);
	cf.HandleDeregister(fh);
}

CUfileError_t gds_cufile_buf_register(CUcontext ctx, CUdeviceptr base, size_t n)
{
	CF_SETCTX(ctx);
	return cf.BufRegister((const void *)(uintptr_t)base, n, 0);
}

CUfileError_t gds_cufile_buf_deregister(CUcontext ctx, CUdeviceptr base)
{
	CF_SETCTX(ctx);
	return cf.BufDeregister((const void *)(uintptr_t)base);
}

CUfileError_t gds_cufile_stats_start(int level)
{
	CUfileError_t e = cf.SetStatsLevel(level);
	if (e.err != GDS_CU_FILE_SUCCESS)
		return e;
	return cf.StatsStart();
}

CUfileError_t gds_cufile_stats(int level, CUfileStatsLevel1_t *l1, CUfileStatsLevel3_t *l3)
{
	memset(l1, 0, sizeof(*l1));
	memset(l3, 0, sizeof(*l3));
	CUfileError_t e = cf.GetStatsL1(l1);
	if (e.err != GDS_CU_FILE_SUCCESS || level < 3)
		return e;
	return cf.GetStatsL3(l3);
}

ssize_t gds_cufile_read(CUcontext ctx, CUfileHandle_t fh, CUdeviceptr base, size_t n, off_t file_off,
			off_t buf_off, int *errnum, int *cuerr)
{
	*errnum = 0;
	*cuerr = 0;
	CUresult r = cu.CtxSetCurrent(ctx);
	if (r != GDS_CUDA_SUCCESS) {
		*cuerr = r;
		return -GDS_CU_FILE_CUDA_DRIVER_ERROR;
	}
	errno = 0;
	ssize_t got = cf.Read(fh, (void *)(uintptr_t)base, n, file_off, buf_off);
	if (got == -1)
		*errnum = errno;
	return got;
}
