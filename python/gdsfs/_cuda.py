"""CUDA backend over ctypes on libcuda.so.1 (the driver API; no toolkit).

The import sequence is the one of proto/PROTOCOL.md (and the Go client's
client/chunkmap/cuda.go): import each chunk descriptor (cuMemImportFromShareableHandle,
POSIX fd handles), reserve one address range, map the chunks back to back,
grant the device access (read-only for a shared grant, read-write for a
private one), release the handles (the mappings hold the memory). It runs
in the device's primary context, which is the one torch and cupy use.
"""

import contextlib
import ctypes
import os
import threading

from ._proto import check_chunks

CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1
CU_MEM_LOCATION_TYPE_DEVICE = 1
CU_MEM_ACCESS_FLAGS_PROT_READ = 1
CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3
CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_NOT_SUPPORTED = 801

_CUdeviceptr = ctypes.c_ulonglong
_CUhandle = ctypes.c_ulonglong
_CUresult = ctypes.c_int
_P = ctypes.POINTER


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AccessDesc(ctypes.Structure):
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


class _UUID(ctypes.Structure):
    _fields_ = [("bytes", ctypes.c_ubyte * 16)]


assert ctypes.sizeof(_AccessDesc) == 12 and ctypes.sizeof(_UUID) == 16

# (attribute, names in order of preference, argtypes): the _v2 entry points
# where they exist, as gpu/cuda/shim.c loads them.
_FUNCS = [
    ("Init", ["cuInit"], [ctypes.c_uint]),
    ("DeviceGetCount", ["cuDeviceGetCount"], [_P(ctypes.c_int)]),
    ("DeviceGet", ["cuDeviceGet"], [_P(ctypes.c_int), ctypes.c_int]),
    ("DeviceGetUuid", ["cuDeviceGetUuid_v2", "cuDeviceGetUuid"], [_P(_UUID), ctypes.c_int]),
    ("DevicePrimaryCtxRetain", ["cuDevicePrimaryCtxRetain"], [_P(ctypes.c_void_p), ctypes.c_int]),
    ("DevicePrimaryCtxRelease", ["cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease"], [ctypes.c_int]),
    ("CtxGetCurrent", ["cuCtxGetCurrent"], [_P(ctypes.c_void_p)]),
    ("CtxSetCurrent", ["cuCtxSetCurrent"], [ctypes.c_void_p]),
    ("CtxSynchronize", ["cuCtxSynchronize"], []),
    ("GetErrorName", ["cuGetErrorName"], [_CUresult, _P(ctypes.c_char_p)]),
    ("MemImportFromShareableHandle", ["cuMemImportFromShareableHandle"], [_P(_CUhandle), ctypes.c_void_p, ctypes.c_int]),
    ("MemRelease", ["cuMemRelease"], [_CUhandle]),
    ("MemAddressReserve", ["cuMemAddressReserve"],
     [_P(_CUdeviceptr), ctypes.c_size_t, ctypes.c_size_t, _CUdeviceptr, ctypes.c_ulonglong]),
    ("MemAddressFree", ["cuMemAddressFree"], [_CUdeviceptr, ctypes.c_size_t]),
    ("MemMap", ["cuMemMap"], [_CUdeviceptr, ctypes.c_size_t, ctypes.c_size_t, _CUhandle, ctypes.c_ulonglong]),
    ("MemUnmap", ["cuMemUnmap"], [_CUdeviceptr, ctypes.c_size_t]),
    ("MemSetAccess", ["cuMemSetAccess"], [_CUdeviceptr, ctypes.c_size_t, _P(_AccessDesc), ctypes.c_size_t]),
    ("MemcpyDtoH", ["cuMemcpyDtoH_v2"], [ctypes.c_void_p, _CUdeviceptr, ctypes.c_size_t]),
]


def format_uuid(b):
    """nvidia-smi's form: GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx."""
    b = bytes(b)
    h = b.hex()
    return "GPU-%s-%s-%s-%s-%s" % (h[0:8], h[8:12], h[12:16], h[16:20], h[20:32])


class Driver:
    """libcuda.so.1, loaded and initialised once per process."""

    def __init__(self):
        try:
            lib = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            raise RuntimeError(
                "gdsfs: the lease lives on a GPU but the CUDA driver (libcuda.so.1) cannot be loaded: %s" % e
            ) from None
        self.lib = lib
        for attr, names, argtypes in _FUNCS:
            fn = None
            for n in names:
                try:
                    fn = getattr(lib, n)
                except AttributeError:
                    continue
                fn.restype = _CUresult
                fn.argtypes = argtypes
                fn.name_ = n
                break
            if fn is None:
                raise RuntimeError("gdsfs: libcuda.so.1 lacks %s (driver too old?)" % " / ".join(names))
            setattr(self, attr, fn)
        self.check(self.Init, 0)
        self.pid = os.getpid()
        self._found = {}  # device name (lower case) -> (ordinal, CUdevice): a process's devices do not change

    def error_name(self, r):
        s = ctypes.c_char_p()
        try:
            if self.GetErrorName(r, ctypes.byref(s)) == 0 and s.value:
                return s.value.decode()
        except Exception:
            pass
        return "CUresult %d" % r

    def check(self, fn, *args):
        r = fn(*args)
        if r != 0:
            raise RuntimeError("gdsfs: %s failed: %s (%d)" % (fn.name_, self.error_name(r), r))

    def find(self, name):
        """(ordinal, CUdevice) of the device whose UUID names it; the ordinal is
        this process's (CUDA_VISIBLE_DEVICES applies), as torch counts."""
        hit = self._found.get(name.lower())
        if hit is not None:
            return hit
        n = ctypes.c_int()
        self.check(self.DeviceGetCount, ctypes.byref(n))
        seen = []
        for i in range(n.value):
            dev = ctypes.c_int()
            self.check(self.DeviceGet, ctypes.byref(dev), i)
            u = _UUID()
            self.check(self.DeviceGetUuid, ctypes.byref(u), dev.value)
            got = format_uuid(u.bytes)
            if got.lower() == name.lower():
                self._found[name.lower()] = (i, dev.value)
                return i, dev.value
            seen.append(got)
        raise RuntimeError(
            "gdsfs: the lease lives on %s, which is not among this process's %d CUDA devices %s "
            "(CUDA_VISIBLE_DEVICES=%r)" % (name, n.value, seen, os.environ.get("CUDA_VISIBLE_DEVICES"))
        )

    def retain(self, dev):
        ctx = ctypes.c_void_p()
        self.check(self.DevicePrimaryCtxRetain, ctypes.byref(ctx), dev)
        return ctx.value

    def release(self, dev):
        self.check(self.DevicePrimaryCtxRelease, dev)

    @contextlib.contextmanager
    def current(self, ctx):
        """Make ctx current on this thread; put back a different one that was."""
        prev = ctypes.c_void_p()
        if self.CtxGetCurrent(ctypes.byref(prev)) != 0:
            prev.value = None
        if prev.value != ctx:
            self.check(self.CtxSetCurrent, ctx)
        try:
            yield
        finally:
            if prev.value and prev.value != ctx:
                self.CtxSetCurrent(prev.value)


def device_uuid(drv, ordinal):
    """The UUID of this process's CUDA device ordinal ("GPU-...")."""
    dev = ctypes.c_int()
    drv.check(drv.DeviceGet, ctypes.byref(dev), ordinal)
    u = _UUID()
    drv.check(drv.DeviceGetUuid, ctypes.byref(u), dev.value)
    return format_uuid(u.bytes)


_driver = None
_driver_lock = threading.Lock()


def _after_fork_in_child():
    global _driver_lock
    _driver_lock = threading.Lock()  # another thread (the lease-ahead worker's _warm) may have held it


os.register_at_fork(after_in_child=_after_fork_in_child)


def driver():
    global _driver
    with _driver_lock:
        if _driver is None or _driver.pid != os.getpid():
            if _driver is not None:
                raise RuntimeError("gdsfs: CUDA was initialised before this process forked; "
                                   "use GPU leases in the parent or start workers with 'spawn'")
            _driver = Driver()
        return _driver


class CudaMapping:
    """The chunks imported on their GPU and mapped at one device pointer."""

    def __init__(self, device, fds, lens, size, writable=False):
        total = check_chunks(fds, lens, size)
        # Read-only unless private; a driver that refuses read-only access
        # on device memory gets read-write, and `readonly` says so.
        self.readonly = not writable
        d = driver()
        self._d = d
        self.device = device
        self.lens = tuple(lens)
        self.total = total
        self.size = size
        self.ptr = 0
        self.ordinal, self.dev = d.find(device)
        self.ctx = d.retain(self.dev)
        try:
            with d.current(self.ctx):
                self._build(fds)
        except BaseException:
            try:
                d.release(self.dev)
            except Exception:
                pass
            raise

    def _build(self, fds):
        d = self._d
        handles = []
        try:
            for i, fd in enumerate(fds):
                h = _CUhandle()
                try:
                    d.check(d.MemImportFromShareableHandle, ctypes.byref(h), ctypes.c_void_p(fd),
                            CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
                except RuntimeError as e:
                    raise RuntimeError("%s (chunk %d)" % (e, i)) from None
                handles.append(h.value)
            ptr = _CUdeviceptr()
            d.check(d.MemAddressReserve, ctypes.byref(ptr), self.total, 0, 0, 0)
            base = ptr.value
            mapped = 0
            try:
                flags = CU_MEM_ACCESS_FLAGS_PROT_READ if self.readonly else CU_MEM_ACCESS_FLAGS_PROT_READWRITE
                off = base
                for i, (h, n) in enumerate(zip(handles, self.lens)):
                    try:
                        d.check(d.MemMap, off, n, 0, h, 0)
                        mapped += 1
                        desc = _AccessDesc(_Location(CU_MEM_LOCATION_TYPE_DEVICE, self.dev), flags)
                        r = d.MemSetAccess(off, n, ctypes.byref(desc), 1)
                        if r in (CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_SUPPORTED) and i == 0 and self.readonly:
                            flags, self.readonly = CU_MEM_ACCESS_FLAGS_PROT_READWRITE, False
                            desc = _AccessDesc(_Location(CU_MEM_LOCATION_TYPE_DEVICE, self.dev), flags)
                            r = d.MemSetAccess(off, n, ctypes.byref(desc), 1)
                        if r != 0:
                            raise RuntimeError("gdsfs: cuMemSetAccess failed: %s (%d)" % (d.error_name(r), r))
                    except RuntimeError as e:
                        raise RuntimeError("%s (chunk %d)" % (e, i)) from None
                    off += n
            except BaseException:
                self._unmap(base, mapped)
                raise
            self.ptr = base
        finally:
            for h in handles:
                d.MemRelease(h)  # the mappings hold the memory

    def _unmap(self, base, mapped):
        d = self._d
        errs = []
        off = base
        for n in self.lens[:mapped]:
            r = d.MemUnmap(off, n)
            if r != 0:
                errs.append("cuMemUnmap: %s" % d.error_name(r))
            off += n
        r = d.MemAddressFree(base, self.total)
        if r != 0:
            errs.append("cuMemAddressFree: %s" % d.error_name(r))
        return errs

    def read(self, offset, n):
        """Copy n bytes at offset to host memory."""
        if n == 0:
            return b""
        buf = ctypes.create_string_buffer(n)
        with self._d.current(self.ctx):
            self._d.check(self._d.MemcpyDtoH, buf, self.ptr + offset, n)
        return buf.raw

    def close(self):
        """Wait for the context's work (a kernel may still read the range),
        unmap, free the range, release the primary context."""
        base, self.ptr = self.ptr, 0
        if not base:
            return
        d = self._d
        errs = []
        with d.current(self.ctx):
            r = d.CtxSynchronize()
            if r != 0:
                errs.append("cuCtxSynchronize: %s" % d.error_name(r))
            errs += self._unmap(base, len(self.lens))
        r = d.DevicePrimaryCtxRelease(self.dev)
        if r != 0:
            errs.append("cuDevicePrimaryCtxRelease: %s" % d.error_name(r))
        if errs:
            raise RuntimeError("gdsfs: unmapping %s: %s" % (self.device, "; ".join(errs)))
