"""Lease: a staged file mapped into this process."""

import ctypes
import errno as _errno
import logging
import os
import sys
import threading
import warnings
import weakref

from ._proto import Conn, daemon_error, _close_fds
from ._mount import locate

log = logging.getLogger("gdsfs")

__all__ = ["Lease", "open", "stat", "load", "disconnect"]

# Errors of a daemon that went away: the lease ended with it.
_GONE = (_errno.EPIPE, _errno.ECONNRESET, _errno.ENOTCONN, _errno.ECONNREFUSED, _errno.ESTALE)


def _is_gpu(device):
    return isinstance(device, str) and device.startswith("GPU-")


def _layout(size, itemsize, shape, offset):
    """Validate (shape, offset) against a file of size bytes; return
    (shape tuple, bytes spanned)."""
    if isinstance(offset, bool) or not isinstance(offset, int):
        raise TypeError("gdsfs: offset must be an int, not %r" % (offset,))
    if offset < 0 or offset > size:
        raise ValueError("gdsfs: offset %d is outside the %d-byte file" % (offset, size))
    if offset % itemsize:
        raise ValueError(
            "gdsfs: offset %d is not a multiple of the element size (%d bytes); "
            "take a uint8 view and copy, or choose an aligned offset" % (offset, itemsize)
        )
    avail = size - offset
    if shape is None:
        return (avail // itemsize,), (avail // itemsize) * itemsize
    if isinstance(shape, int):
        shape = (shape,)
    try:
        shape = tuple(int(d) for d in shape)
    except TypeError:
        raise TypeError("gdsfs: shape must be a sequence of ints, not %r" % (shape,)) from None
    count = 1
    for d in shape:
        if d < 0:
            raise ValueError("gdsfs: shape %r has a negative dimension" % (shape,))
        count *= d
    need = count * itemsize
    if need > avail:
        raise ValueError(
            "gdsfs: shape %r of %d-byte elements needs %d bytes; only %d remain past offset %d "
            "in the %d-byte file" % (shape, itemsize, need, avail, offset, size)
        )
    return shape, need


def _import_torch():
    try:
        import torch
    except ImportError as e:
        raise ImportError("gdsfs: tensor()/load() need PyTorch (%s); use memoryview() or cupy() instead" % e) from None
    return torch


def _torch_dtype(torch, dtype):
    if dtype is None:
        return torch.uint8
    if isinstance(dtype, str):
        t = getattr(torch, dtype, None)
        if not isinstance(t, torch.dtype):
            raise TypeError("gdsfs: %r is not a torch dtype name" % dtype)
        return t
    if isinstance(dtype, torch.dtype):
        return dtype
    raise TypeError("gdsfs: dtype must be a torch.dtype or its name, not %r" % (dtype,))


class _CudaView:
    """What torch.as_tensor and cupy hold on to: it keeps the lease (and so
    the mapping) alive for as long as any tensor or array made from it."""

    __slots__ = ("lease", "ptr", "nbytes", "__weakref__")

    def __init__(self, lease, ptr, nbytes):
        self.lease = lease
        self.ptr = ptr
        self.nbytes = nbytes

    @property
    def __cuda_array_interface__(self):
        return {
            "version": 3,
            "shape": (self.nbytes,),
            "typestr": "|u1",
            "descr": [("", "|u1")],
            "data": (self.ptr, False),
            "strides": None,
            "stream": None,  # staged bytes are complete: nothing to wait for
        }


class Lease:
    """A staged file mapped into this process; it pins the file in the
    daemon's cache until closed.

    Attributes: path, size, device ("GPU-<uuid>" or "host"), generation,
    sharing ("shared" or "private"), id, epoch, chunks (lengths), ordinal
    (CUDA ordinal in this process, None on host), ptr (CUDA device pointer on
    a GPU, address of the read-only mapping on host).

    close() unmaps and releases. Views made from the lease (memoryview(),
    tensor(), cupy()) keep it alive: if any still exists when close() is
    called (or the with-block ends), the unmapping and release wait until
    the last one is garbage-collected, so a view can never point at unmapped
    memory. `closed` turns True at once (no new views); `released` when the
    mapping is gone.
    """

    def __init__(self, conn, resp, fds, path, shared=False):
        # Built by open(); takes ownership of conn unless shared (and closes
        # the fds).
        self._lock = threading.RLock()
        self._conn = conn
        self._shared = shared
        self._pid = os.getpid()
        self._mapping = None
        self._nviews = 0
        self._closing = False
        self._torn = False
        self.path = os.fspath(path)
        self.id = resp.get("lease", 0)
        self.epoch = resp.get("epoch", 0)
        self.size = int(resp.get("size", 0))
        self.generation = resp.get("generation", 0)
        self.device = resp.get("device", "")
        self.sharing = resp.get("sharing", "")
        self.chunks = tuple(int(c.get("len", 0)) for c in (resp.get("chunks") or []))
        try:
            if len(fds) != len(self.chunks):
                raise OSError(
                    _errno.EPROTO,
                    "gdsfs acquire %s: %d descriptors for %d chunks" % (self.path, len(fds), len(self.chunks)),
                )
            if _is_gpu(self.device):
                from ._cuda import CudaMapping

                self._mapping = CudaMapping(self.device, fds, self.chunks, self.size)
            elif self.device == "host":
                from ._host import HostMapping

                self._mapping = HostMapping(fds, self.chunks, self.size)
            else:
                raise OSError(_errno.EPROTO, "gdsfs acquire %s: unknown device %r" % (self.path, self.device))
        except BaseException:
            _close_fds(fds)
            self._torn = self._closing = True
            self._release_quietly()
            raise
        _close_fds(fds)  # the mapping holds the memory now

    # --- state ---------------------------------------------------------

    @property
    def is_gpu(self):
        return _is_gpu(self.device)

    @property
    def ordinal(self):
        return getattr(self._mapping, "ordinal", None)

    @property
    def ptr(self):
        m = self._mapping
        if m is None or self._torn:
            raise ValueError("gdsfs: lease of %s is released" % self.path)
        return m.ptr

    @property
    def closed(self):
        return self._closing

    @property
    def released(self):
        return self._torn

    def __repr__(self):
        state = "released" if self._torn else ("closing" if self._closing else "open")
        return "<gdsfs.Lease %r size=%d device=%s generation=%s lease=%s %s>" % (
            self.path, self.size, self.device, self.generation, self.id, state)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # --- closing -------------------------------------------------------

    def close(self):
        """Unmap, then release the lease and close its connection; calling it
        again does nothing. With views still alive, this happens when the
        last one is garbage-collected. A daemon that has gone away is not an
        error (its leases ended with it); an unmapping failure or an error
        answer to the release raises OSError/RuntimeError."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
            if self._nviews > 0:
                return
        self._teardown(quiet=False)

    def _add_view(self, holder):
        with self._lock:
            if self._closing:
                raise ValueError("gdsfs: lease of %s is closed" % self.path)
            self._nviews += 1
        f = weakref.finalize(holder, self._view_gone)
        f.atexit = False

    def _view_gone(self):
        with self._lock:
            self._nviews -= 1
            finish = self._nviews <= 0 and self._closing and not self._torn
        if finish:
            self._teardown(quiet=True)

    def _teardown(self, quiet):
        with self._lock:
            if self._torn:
                return
            self._torn = True
        errs = []
        forked = os.getpid() != self._pid
        m, self._mapping = self._mapping, None
        if m is not None and not (forked and self.is_gpu):
            try:
                m.close()
            except Exception as e:
                errs.append(e)
        if not forked:
            try:
                self._release()
            except Exception as e:
                errs.append(e)
        if self._conn is not None and (forked or not self._shared):
            self._conn.close()  # in a forked child only this copy of the socket
        if errs:
            if quiet:
                for e in errs:
                    log.warning("gdsfs: closing lease of %s: %s", self.path, e)
            else:
                raise errs[0]

    def _release(self):
        try:
            resp, _ = self._conn.roundtrip({"op": "release", "lease": self.id, "epoch": self.epoch})
        except OSError as e:
            if e.errno in _GONE or isinstance(e, ConnectionError):
                log.debug("gdsfs: lease %s of %s ended with its daemon: %s", self.id, self.path, e)
                return
            raise
        if not resp.get("ok"):
            if resp.get("errno") == "ESTALE":
                return
            raise daemon_error(resp, self.path)

    def _release_quietly(self):
        try:
            if self._conn is not None and self.id:
                self._release()
        except Exception:
            pass
        if self._conn is not None and not self._shared:
            self._conn.close()

    def __del__(self):
        try:
            if getattr(self, "_torn", True):
                return
            if sys.is_finalizing():
                # Late in interpreter shutdown: leave unmapping to the exit;
                # closing the socket (at exit) ends the lease.
                return
            self._closing = True
            self._teardown(quiet=True)
        except Exception:
            pass

    # --- views ---------------------------------------------------------

    def _check_open(self):
        if self._closing:
            raise ValueError("gdsfs: lease of %s is closed" % self.path)

    def read(self, offset=0, size=None):
        """Copy staged bytes into a new bytes object (device to host on a GPU)."""
        self._check_open()
        if offset < 0 or offset > self.size:
            raise ValueError("gdsfs: offset %d is outside the %d-byte file" % (offset, self.size))
        n = self.size - offset if size is None else min(size, self.size - offset)
        if n < 0:
            raise ValueError("gdsfs: negative size %d" % size)
        return self._mapping.read(offset, n)

    def memoryview(self):
        """A read-only memoryview of exactly `size` bytes over the host
        mapping (no copy). It keeps the lease alive while it exists."""
        self._check_open()
        if self.is_gpu:
            raise TypeError(
                "gdsfs: %s is staged on %s; memoryview() needs the host backend "
                "(staging.device=host). Use tensor(), cupy(), ptr, or read() for a copy" % (self.path, self.device)
            )
        if self.size == 0:
            return memoryview(b"")
        arr = (ctypes.c_ubyte * self.size).from_address(self._mapping.ptr)
        arr._gdsfs_lease = self  # noqa: the buffer's exporter keeps the lease
        self._add_view(arr)
        return memoryview(arr).cast("B").toreadonly()

    def tensor(self, dtype=None, shape=None, offset=0):
        """A zero-copy torch tensor over the staged bytes from offset: on
        cuda:<ordinal> for a GPU lease, on the CPU (read-only memory: do not
        write to it) on the host backend. dtype: a torch.dtype or its name
        (default uint8); shape: default 1-D of (size - offset) // itemsize.
        The tensor (and every view of it) keeps the lease alive."""
        torch = _import_torch()
        self._check_open()
        dt = _torch_dtype(torch, dtype)
        itemsize = torch.empty((), dtype=dt).element_size()
        shape, nbytes = _layout(self.size, itemsize, shape, offset)
        if nbytes == 0:
            dev = "cuda:%d" % self.ordinal if self.is_gpu else "cpu"
            return torch.empty(shape, dtype=dt, device=dev)
        if self.is_gpu:
            holder = _CudaView(self, self._mapping.ptr + offset, nbytes)
            self._add_view(holder)
            t = torch.as_tensor(holder, device="cuda:%d" % self.ordinal)
        else:
            mv = self.memoryview()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "The given buffer is not writable"
                t = torch.frombuffer(mv, dtype=torch.uint8, count=nbytes, offset=offset)
        if dt != torch.uint8:
            t = t.view(dt)
        return t.view(shape)

    def cupy(self, dtype="uint8", shape=None, offset=0):
        """A zero-copy cupy.ndarray over the staged bytes (GPU leases only).
        The array keeps the lease alive."""
        self._check_open()
        if not self.is_gpu:
            raise TypeError("gdsfs: %s is staged in host memory; cupy() needs a GPU lease. "
                            "Use memoryview() or tensor()" % self.path)
        try:
            import cupy
            import numpy
        except ImportError as e:
            raise ImportError("gdsfs: cupy() needs CuPy (%s)" % e) from None
        dt = numpy.dtype(dtype)
        shape, nbytes = _layout(self.size, dt.itemsize, shape, offset)
        if nbytes == 0:
            with cupy.cuda.Device(self.ordinal):
                return cupy.empty(shape, dtype=dt)
        holder = _CudaView(self, self._mapping.ptr + offset, nbytes)
        self._add_view(holder)
        mem = cupy.cuda.UnownedMemory(holder.ptr, nbytes, holder, self.ordinal)
        return cupy.ndarray(shape, dtype=dt, memptr=cupy.cuda.MemoryPointer(mem, 0))


# --- module functions -----------------------------------------------------



# One connection per (socket, timeout) per process carries every lease
# taken through it: no connect per lease, and no cap on leases from the
# daemon's ipc.max_connections. The daemon still ends all of them when the
# process dies (the connection closes). A forked child makes its own.
_shared = {}
_shared_lock = threading.Lock()

# Where the files of a directory are leased from: directory -> (socket,
# directory relative to the mount, mount). Reading /proc/self/mountinfo and
# .gdsfs/socket costs more than the rest of an acquire; a failed connection
# drops the entry.
_located = {}


def disconnect():
    """Close this process's connections to gdsfs daemons. Leases still open
    on them end (the daemon releases them); later opens connect again."""
    with _shared_lock:
        conns = list(_shared.values())
        _shared.clear()
    _located.clear()
    for c in conns:
        c.close()


def _shared_conn(sock, timeout, fresh=False):
    """(connection, whether it served earlier requests)."""
    key = (sock, timeout)
    with _shared_lock:
        c = _shared.get(key)
        if fresh or c is None or c.closed or c.pid != os.getpid():
            c = Conn(sock, timeout)
            _shared[key] = c
            return c, False
        return c, True


def _locate(path, socket):
    """locate(), remembered per directory; the last value says whether it
    was remembered."""
    if socket or os.environ.get("GDSFS_SOCKET"):
        return locate(path, socket) + (False,)
    p = os.path.abspath(os.fspath(path))
    d, base = os.path.split(p)
    hit = _located.get(d)
    if hit is not None:
        sock, reldir, mnt = hit
        return sock, os.path.join(reldir, base) if reldir not in ("", ".") else base, mnt, True
    sock, rel, mnt = locate(path, socket)
    if len(_located) > 4096:
        _located.clear()
    _located[d] = (sock, os.path.dirname(rel), mnt)
    return sock, rel, mnt, False


# Errors that mean no daemon answered on a remembered socket or connection.
_STALE = (_errno.ENOENT, _errno.ECONNREFUSED, _errno.ECONNRESET, _errno.EPIPE, _errno.ENOTCONN)


def open(path, *, socket=None, timeout=None):  # noqa: A001 (gdsfs.open)
    """Lease the staged bytes of path, a file under a gdsfs mount (staging
    it first if needed), and map them. socket: the lease socket (default: env
    GDSFS_SOCKET, else the mount's .gdsfs/socket). timeout: seconds for
    socket operations (default: wait as long as the daemon does, bounded by
    its ipc.acquire_timeout)."""
    fresh = False
    while True:
        sock, req_path, _, remembered = _locate(path, socket)
        reused = False
        try:
            conn, reused = _shared_conn(sock, timeout, fresh)
            resp, fds = conn.request({"op": "acquire", "path": req_path}, path=path)
        except OSError as e:
            if not fresh and (remembered or reused) and e.errno in _STALE and not getattr(e, "gdsfs_answer", False):
                # The daemon restarted or the mount moved since: look again,
                # on a new connection, once.
                _located.clear()
                fresh = True
                continue
            raise
        return Lease(conn, resp, fds, path, shared=True)


def stat(path, *, socket=None, timeout=None):
    """The daemon's view of path without staging it: a dict with size,
    state (e.g. "resident", "absent"), load_path, ..."""
    sock, req_path, _ = locate(path, socket)
    conn = Conn(sock, timeout)
    try:
        resp, _ = conn.request({"op": "stat", "path": req_path}, path=path)
    finally:
        conn.close()
    out = {k: v for k, v in resp.items() if k != "ok"}
    out.setdefault("size", 0)
    out.setdefault("state", "")
    out.setdefault("load_path", "")
    return out


def load(path, dtype=None, shape=None, offset=0, *, socket=None, timeout=None):
    """A zero-copy torch tensor of path's staged bytes (see Lease.tensor).
    The lease is released when the tensor, and every view of it, is
    garbage-collected."""
    _import_torch()
    lease = open(path, socket=socket, timeout=timeout)
    try:
        t = lease.tensor(dtype, shape, offset)
    except BaseException:
        lease.close()
        raise
    lease.close()  # takes effect when the tensor is gone
    return t
