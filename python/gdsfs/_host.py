"""Host backend: the chunk memfds mapped back to back: read-only and shared
for a shared grant (the daemon sealed them against writes, so no process
can map them writable), writable copy-on-write (this process only) for a
private one."""

import ctypes
import errno as _errno
import os

from ._proto import check_chunks

# Linux values (x86_64 and aarch64 alike).
PROT_NONE = 0x0
PROT_READ = 0x1
PROT_WRITE = 0x2
MAP_SHARED = 0x01
MAP_PRIVATE = 0x02
MAP_FIXED = 0x10
MAP_ANONYMOUS = 0x20
MAP_NORESERVE = 0x4000

_libc = None


def _lib():
    global _libc
    if _libc is None:
        lib = ctypes.CDLL(None, use_errno=True)
        lib.mmap.restype = ctypes.c_void_p
        lib.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
        lib.munmap.restype = ctypes.c_int
        lib.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        _libc = lib
    return _libc


_MAP_FAILED = ctypes.c_void_p(-1).value


def _errno_error(what):
    e = ctypes.get_errno()
    return OSError(e, "%s: %s" % (what, os.strerror(e)))


class HostMapping:
    """Contiguous mapping of memfds (one per chunk). It does not close the
    descriptors; the mapping keeps the memory alive on its own."""

    def __init__(self, fds, lens, size, writable=False):
        total = check_chunks(fds, lens, size)
        self.readonly = not writable
        self.size = size
        self.total = total
        self.lens = tuple(lens)
        self.base = 0
        if total == 0:
            return
        lib = _lib()
        base = lib.mmap(None, total, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0)
        if base is None or base == _MAP_FAILED:
            raise _errno_error("gdsfs: reserving %d bytes of address space" % total)
        prot, flags = PROT_READ, MAP_SHARED
        if writable:
            prot, flags = PROT_READ | PROT_WRITE, MAP_PRIVATE
        try:
            off = 0
            for i, (fd, n) in enumerate(zip(fds, lens)):
                st = os.fstat(fd)
                if st.st_size < n:
                    raise OSError(_errno.EINVAL, "gdsfs: chunk %d: descriptor holds %d bytes, want %d" % (i, st.st_size, n))
                r = lib.mmap(base + off, n, prot, flags | MAP_FIXED, fd, 0)
                if r is None or r == _MAP_FAILED:
                    raise _errno_error("gdsfs: mapping chunk %d (%d bytes)" % (i, n))
                if r != base + off:
                    raise OSError(_errno.EFAULT, "gdsfs: chunk %d mapped at %#x, not %#x" % (i, r, base + off))
                off += n
        except BaseException:
            lib.munmap(base, total)
            raise
        self.base = base

    @property
    def ptr(self):
        return self.base

    def read(self, offset, n):
        return ctypes.string_at(self.base + offset, n) if n else b""

    def close(self):
        base, self.base = self.base, 0
        if base:
            if _lib().munmap(base, self.total) != 0:
                raise _errno_error("gdsfs: munmap of %d bytes" % self.total)
