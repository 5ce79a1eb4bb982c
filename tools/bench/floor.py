# The importing side of the floor of `gdsfs bench lease`: the raw primitive a
# lease is built on. Usage: bench_floor.py KIND ORDINAL, with a SOCK_SEQPACKET
# socket on fd 3. KIND is "cuda" (the driver API through ctypes, no gdsfs
# code: import each chunk fd, reserve one range, map the chunks back to back,
# grant access) or "host" (memfds mapped back to back, read-only).
# Protocol, one message each: we send "ready"; then per sample we receive
# {"lens": [...]} with the chunk fds, map them, send "mapped"; receive
# "unmap", unmap and close, send "done"; "quit" ends. A failure is sent as
# "error: ..." and ends the process.
import ctypes
import json
import os
import socket
import sys

kind, ordinal = sys.argv[1], int(sys.argv[2])
sock = socket.socket(fileno=3)


class Loc(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class Access(ctypes.Structure):
    _fields_ = [("location", Loc), ("flags", ctypes.c_int)]


class Cuda:
    def __init__(self, ordinal):
        u64, vp, sz = ctypes.c_ulonglong, ctypes.c_void_p, ctypes.c_size_t
        self.lib = lib = ctypes.CDLL("libcuda.so.1")
        sigs = {
            "cuInit": [ctypes.c_uint],
            "cuDeviceGet": [ctypes.POINTER(ctypes.c_int), ctypes.c_int],
            "cuDevicePrimaryCtxRetain": [ctypes.POINTER(vp), ctypes.c_int],
            "cuCtxSetCurrent": [vp],
            "cuMemImportFromShareableHandle": [ctypes.POINTER(u64), vp, ctypes.c_int],
            "cuMemAddressReserve": [ctypes.POINTER(u64), sz, sz, u64, u64],
            "cuMemMap": [u64, sz, sz, u64, u64],
            "cuMemSetAccess": [u64, sz, ctypes.POINTER(Access), sz],
            "cuMemRelease": [u64],
            "cuMemUnmap": [u64, sz],
            "cuMemAddressFree": [u64, sz],
        }
        for name, args in sigs.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = args, ctypes.c_int
        self.call("cuInit", 0)
        dev = ctypes.c_int()
        self.call("cuDeviceGet", ctypes.byref(dev), ordinal)
        ctx = ctypes.c_void_p()
        self.call("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), dev.value)
        self.call("cuCtxSetCurrent", ctx)
        self.access = Access(Loc(1, dev.value), 3)  # CU_MEM_LOCATION_TYPE_DEVICE, PROT_READWRITE

    def call(self, name, *args):
        r = getattr(self.lib, name)(*args)
        if r != 0:
            raise RuntimeError("%s failed: CUresult %d" % (name, r))

    def map(self, fds, lens):
        total = sum(lens)
        handles = []
        for fd in fds:
            h = ctypes.c_ulonglong()
            self.call("cuMemImportFromShareableHandle", ctypes.byref(h), ctypes.c_void_p(fd), 1)
            handles.append(h.value)
        base = ctypes.c_ulonglong()
        self.call("cuMemAddressReserve", ctypes.byref(base), total, 0, 0, 0)
        off = base.value
        for h, n in zip(handles, lens):
            self.call("cuMemMap", off, n, 0, h, 0)
            off += n
        self.call("cuMemSetAccess", base.value, total, ctypes.byref(self.access), 1)
        for h in handles:
            self.call("cuMemRelease", h)  # the mappings hold the memory
        return base.value

    def unmap(self, base, lens):
        off = base
        for n in lens:
            self.call("cuMemUnmap", off, n)
            off += n
        self.call("cuMemAddressFree", base, sum(lens))


class Host:
    PROT_NONE, PROT_READ = 0, 1
    MAP_SHARED, MAP_PRIVATE, MAP_FIXED, MAP_ANONYMOUS = 1, 2, 0x10, 0x20

    def __init__(self):
        libc = ctypes.CDLL(None, use_errno=True)
        self.mmap, self.munmap = libc.mmap, libc.munmap
        self.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
        self.mmap.restype = ctypes.c_void_p
        self.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]

    def _mmap(self, *args):
        p = self.mmap(*args)
        if p is None or p == ctypes.c_void_p(-1).value:
            raise OSError(ctypes.get_errno(), "mmap: " + os.strerror(ctypes.get_errno()))
        return p

    def map(self, fds, lens):
        base = self._mmap(None, sum(lens), self.PROT_NONE, self.MAP_PRIVATE | self.MAP_ANONYMOUS, -1, 0)
        off = base
        for fd, n in zip(fds, lens):
            self._mmap(off, n, self.PROT_READ, self.MAP_SHARED | self.MAP_FIXED, fd, 0)
            off += n
        return base

    def unmap(self, base, lens):
        self.munmap(base, sum(lens))


def main():
    try:
        dev = Cuda(ordinal) if kind == "cuda" else Host()
    except Exception as e:
        sock.send(("error: %s" % e).encode())
        return 1
    sock.send(b"ready")
    while True:
        msg, fds, _, _ = socket.recv_fds(sock, 4096, 256)
        if not msg or msg == b"quit":
            return 0
        try:
            lens = json.loads(msg)["lens"]
            base = dev.map(fds, lens)
            sock.send(b"mapped")
            sock.recv(64)  # "unmap"
            dev.unmap(base, lens)
        except Exception as e:
            sock.send(("error: %s" % e).encode())
            return 1
        finally:
            for fd in fds:
                os.close(fd)
        sock.send(b"done")


sys.exit(main())
