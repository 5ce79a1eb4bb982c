"""Lease: a staged file mapped into this process; gdsfs.open, stat, load
(gdsfs.open_many, in _many, builds on them)."""

import ctypes
import errno as _errno
import logging
import os
import stat as _stat
import sys
import threading
import warnings
import weakref

from ._proto import Conn, daemon_error, room_wait_fields
from ._device import resolve as _resolve_device
from ._mount import _resolve, find, has_dot_dot
from ._registry import registry, _is_gpu

log = logging.getLogger("gdsfs")

__all__ = ["Lease", "open", "stat", "load", "disconnect"]


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
    the mapping) alive for as long as any tensor or array made from it.

    The interface says writable even for a read-only (shared) mapping:
    torch refuses __cuda_array_interface__ marked read-only ("the read only
    flag is not supported"). The memory itself is mapped read-only: a write
    from a kernel faults (an illegal address error in this process, whose
    CUDA context is then lost), and never changes what other leases see."""

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
    """A staged file mapped into this process; the daemon keeps the file
    (never evicted) at least until the lease is closed.

    Attributes: path, size, device ("GPU-<uuid>" or "host"), generation,
    sharing ("shared" or "private"), id, epoch, chunks (lengths), ordinal
    (CUDA ordinal in this process, None on host), ptr (CUDA device pointer on
    a GPU, address of the mapping on host), readonly (True for shared
    leases: the mapping refuses writes), reused (True when this lease reused
    a mapping this process kept: one round trip, no descriptors).

    close() ends the lease without waiting for the daemon. Views made from
    the lease (memoryview(), numpy(), tensor(), cupy()) keep it alive: if any
    still exists when close() is called (or the with-block ends), the end
    waits until the last one is garbage-collected, so a view can never point
    at unmapped memory. `closed` turns True at once (no new views);
    `released` when the lease has ended. The mapping itself may be kept
    after that, for the next gdsfs.open of the same unchanged file, while
    the daemon allows it (gdsfs.disconnect() undoes kept mappings).
    """

    def __init__(self, mapped, conn, resp, path):
        # Built by open() and open_many() around a registry mapping.
        self._lock = threading.RLock()
        self._m = mapped
        self._conn = conn
        self._nviews = 0
        self._closing = False
        self._torn = False
        self.path = os.fspath(path)
        self.id = resp.get("lease", 0)
        self.epoch = resp.get("epoch", 0)
        self.reused = bool(resp.get("reuse"))
        self.size = mapped.size
        self.generation = mapped.generation
        self.device = mapped.device
        self.sharing = mapped.sharing
        self.chunks = mapped.chunks
        self.readonly = mapped.mapping.readonly
        self.identity = _file_identity(resp.get("identity"))

    # --- state ---------------------------------------------------------

    @property
    def is_gpu(self):
        return _is_gpu(self.device)

    @property
    def ordinal(self):
        return getattr(self._m.mapping, "ordinal", None)

    @property
    def ptr(self):
        if self._torn or self._m.mapping is None:
            raise ValueError("gdsfs: lease of %s is released" % self.path)
        return self._m.mapping.ptr

    @property
    def _mapping(self):
        return self._m.mapping

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
        """End the lease; calling it again does nothing. It does not wait
        for the daemon's answer. With views still alive, this happens when the last one
        is garbage-collected. An unmapping failure raises RuntimeError or
        OSError."""
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
        errs = registry.finish(self._m, self._conn, self.id, self.epoch)
        if errs:
            if quiet:
                for e in errs:
                    log.warning("gdsfs: closing lease of %s: %s", self.path, e)
            else:
                raise errs[0]

    def __del__(self):
        try:
            if getattr(self, "_torn", True):
                return
            if sys.is_finalizing():
                # Late in interpreter shutdown: leave unmapping to the exit;
                # the connection closes with the process, ending the lease.
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
        return self._m.mapping.read(offset, n)

    def memoryview(self):
        """A memoryview of exactly `size` bytes over the host mapping (no
        copy): read-only for a shared lease, writable for a private one (its
        own copy). It keeps the lease alive while it exists."""
        self._check_open()
        if self.is_gpu:
            raise TypeError(
                "gdsfs: %s is staged on %s; memoryview() needs the host backend "
                "(staging.device=host). Use tensor(), cupy(), ptr, or read() for a copy" % (self.path, self.device)
            )
        if self.size == 0:
            return memoryview(b"")
        arr = (ctypes.c_ubyte * self.size).from_address(self._m.mapping.ptr)
        arr._gdsfs_lease = self  # noqa: the buffer's exporter keeps the lease
        self._add_view(arr)
        mv = memoryview(arr).cast("B")
        return mv.toreadonly() if self.readonly else mv

    def numpy(self, dtype="uint8", shape=None, offset=0):
        """A zero-copy numpy array over the host mapping (writeable=False
        for a shared lease). It keeps the lease alive."""
        import numpy

        dt = numpy.dtype(dtype)
        shape, nbytes = _layout(self.size, dt.itemsize, shape, offset)
        mv = self.memoryview()
        return numpy.frombuffer(mv, dtype=dt, count=nbytes // dt.itemsize if dt.itemsize else 0,
                                offset=offset).reshape(shape)

    def tensor(self, dtype=None, shape=None, offset=0):
        """A zero-copy torch tensor over the staged bytes from offset: on
        cuda:<ordinal> for a GPU lease, on the CPU on the host backend.
        dtype: a torch.dtype or its name (default uint8); shape: default 1-D
        of (size - offset) // itemsize. The tensor (and every view of it)
        keeps the lease alive.

        torch has no read-only tensors: a tensor of a shared lease looks
        writable, but its memory is mapped read-only, so an in-place op
        faults (SIGSEGV on the host backend; an illegal address CUDA error
        on a GPU, which ends this process's CUDA context) and never changes
        what other leases see. Copy (t.clone()) before writing."""
        torch = _import_torch()
        self._check_open()
        dt = _torch_dtype(torch, dtype)
        itemsize = getattr(dt, "itemsize", None) or torch.empty((), dtype=dt).element_size()  # torch < 2.1: no itemsize
        shape, nbytes = _layout(self.size, itemsize, shape, offset)
        if nbytes == 0:
            dev = "cuda:%d" % self.ordinal if self.is_gpu else "cpu"
            return torch.empty(shape, dtype=dt, device=dev)
        if self.is_gpu:
            holder = _CudaView(self, self._m.mapping.ptr + offset, nbytes)
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
        The array keeps the lease alive. cupy has no read-only arrays: a
        write to a shared lease's array faults (see tensor())."""
        self._check_open()
        if not self.is_gpu:
            raise TypeError("gdsfs: %s is staged in host memory; cupy() needs a GPU lease. "
                            "Use memoryview(), numpy() or tensor()" % self.path)
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
        holder = _CudaView(self, self._m.mapping.ptr + offset, nbytes)
        self._add_view(holder)
        mem = cupy.cuda.UnownedMemory(holder.ptr, nbytes, holder, self.ordinal)
        return cupy.ndarray(shape, dtype=dt, memptr=cupy.cuda.MemoryPointer(mem, 0))


# --- module functions -----------------------------------------------------

# Where the files of a directory are leased from: (explicit socket,
# directory with its links resolved) -> (socket, directory relative to the
# mount, mount owner, (st_dev, st_ino) of the resolved directory). Reading
# /proc/self/mountinfo and .gdsfs/socket costs more than a repeat lease;
# an entry is used only while the resolved directory is the same inode,
# and a failed connection drops the memory.
_located = {}

# Errors that mean no daemon answered on a remembered socket or connection.
_STALE = (_errno.ENOENT, _errno.ECONNREFUSED, _errno.ECONNRESET, _errno.EPIPE, _errno.ENOTCONN)


def disconnect():
    """Undo the mappings this process keeps for repeat leases and close
    their connections, so the daemon holds none of it any more. Leases
    still open are not touched."""
    registry.flush()
    _located.clear()


def _locate(path, socket):
    """(socket, path to send, mount owner, whether it was remembered). The
    path's symbolic links, the file's own too, are resolved at every call
    (a repointed link is followed, and the path sent names the file a
    plain open reads); the rest is remembered per resolved directory."""
    return _located_in(path, socket)[:4]


def _located_in(path, socket):
    """_locate's answer, and the device of the path's directory where the
    other files of that directory are where it says (None where they may
    not be: the path is a mount point, whose directory is another mount's
    or none, or its directory could not be looked at)."""
    explicit = socket or os.environ.get("GDSFS_SOCKET") or ""
    real, base = os.path.split(_resolve(path))
    try:
        st = os.stat(real)
    except OSError:
        t = find(path, socket)  # says what is wrong with the path
        return t.socket, t.rel, t.owner, False, None
    ident = (st.st_dev, st.st_ino)
    file = os.path.join(real, base)
    hit = _located.get((explicit, real))
    if hit is not None and hit[3] == ident and not _mounted_over(file, st.st_dev):
        sock, reldir, owner, _ = hit
        return sock, _in_dir(reldir, base), owner, True, st.st_dev
    t = find(file, socket)
    if t.mount == file:
        return t.socket, t.rel, t.owner, False, None
    if len(_located) > 4096:
        _located.clear()
    _located[(explicit, real)] = (t.socket, os.path.dirname(t.rel), t.owner, ident)
    return t.socket, t.rel, t.owner, False, st.st_dev


def _in_dir(reldir, base):
    """The path to send for file base of the directory sent as reldir."""
    return os.path.join(reldir, base) if reldir not in ("", ".") else base


def _mounted_over(path, dev):
    """Whether path is the root of a mount of another device than its
    directory's (dev): a nested mount, or a file or directory bind-mounted
    there from another filesystem. What is remembered of the directory
    does not hold for it."""
    try:
        return os.lstat(path).st_dev != dev
    except OSError:
        return False


def _locator(socket):
    """_locate for many paths at one moment (one gdsfs.open_many call): a
    directory's links are resolved once for all its files; each file's own
    link still is (a file that is a link, or that cannot be looked at, goes
    through _locate whole)."""
    dirs = {}

    def locate(path):
        p = os.fsdecode(os.fspath(path))
        if has_dot_dot(p):  # goes up from where a link leads: _locate walks it
            return _locate(path, socket)
        d, base = os.path.split(os.path.abspath(p))
        try:
            st = os.lstat(os.path.join(d, base))
        except OSError:
            return _locate(path, socket)
        if _stat.S_ISLNK(st.st_mode):
            return _locate(path, socket)
        where = dirs.get(d)
        if where is None:
            sock, rel, owner, remembered, dev = _located_in(os.path.join(d, base), socket)
            if dev is not None:
                dirs[d] = (sock, os.path.dirname(rel), owner, dev)
            return sock, rel, owner, remembered
        sock, reldir, owner, dev = where
        if st.st_dev != dev:  # a mount of its own there (as _mounted_over tells)
            return _locate(path, socket)
        return sock, _in_dir(reldir, base), owner, True

    return locate


# Answers that say the daemon is at a limit kept mappings count against:
# connections (EMFILE), the uid's leases or held bytes (EDQUOT), its
# capacity (ENOSPC).
_PRESSED = (_errno.EMFILE, _errno.EDQUOT, _errno.ENOSPC)


_IDENTITY = ("ino", "size", "mtime_ns", "ctime_ns")


def _file_identity(v):
    """The grant's identity (PROTOCOL.md) as (ino, size, mtime_ns,
    ctime_ns), or None where it has none (or none this client reads: the
    caller then tells the file otherwise)."""
    if not isinstance(v, dict):
        return None
    out = tuple(v.get(k) for k in _IDENTITY)
    if not all(type(x) is int for x in out):
        return None
    return out


def _drop_if_pressed(e, sock):
    """Undo this process's kept mappings of sock's daemon (closing their
    connections) when e is an answer saying it is at a limit."""
    if getattr(e, "gdsfs_answer", False) and e.errno in _PRESSED:
        registry.flush(sock)


def _retry(e):
    """Whether a failed repeat lease is worth a new connection: the file
    changed (ESTALE), an answer broke the protocol, or the connection
    failed."""
    if getattr(e, "gdsfs_answer", False):
        return e.errno == _errno.ESTALE
    return True


def _acquire(rel, dev, **extra):
    """An acquire request for rel on device dev (None: none named)."""
    req = {"op": "acquire", "path": rel}
    req.update(extra)
    if dev is not None:
        req["device"] = dev
    return req


def _repeat(m, sock, rel, path, dev, extra):
    """Lease an unchanged file again on the connection holding its mapping."""
    conn = m.holder.conn
    resp, fds = conn.request(_acquire(rel, dev, generation=m.generation, **extra), path=path)
    if resp.get("reuse"):
        if resp.get("generation") != m.generation:
            conn.release(resp.get("lease", 0), resp.get("epoch"))
            raise OSError(_errno.EPROTO, "gdsfs acquire %s: reuse of generation %s answered for %s"
                          % (path, resp.get("generation"), m.generation))
        return Lease(m, conn, resp, path)
    try:
        nm = registry.adopt(m.holder, (sock, rel, dev), resp, fds, path)
    except BaseException:
        _give_back(conn, resp, resp.get("epoch"))
        raise
    registry.discard(m)
    return Lease(nm, conn, resp, path)


def _give_back(conn, grant, epoch):
    """Release a full grant this process did not map, and drop it on conn
    (bytes a lease or another grant on conn still uses stay held)."""
    conn.release(grant.get("lease", 0), epoch)
    if grant.get("generation") and grant.get("device"):
        conn.drop(grant["generation"], grant["device"])


def _pooled(where, send, relocate=None):
    """Take a connection of the process's pool for where (socket, owner,
    timeout) (registry.lease_holder), marked busy, and return (its holder,
    send(conn)); the caller checks the holder in. send failing checks it
    in and raises (undoing kept mappings when the daemon is at a limit,
    _drop_if_pressed). One failure is tried once more, only one: a pooled
    connection the daemon closed meanwhile (it restarted), on a new
    connection; or, where relocate is given, a connection no daemon
    answered (_STALE), at the where relocate() returns."""
    for again in (False, True):
        sock, owner, timeout = where
        try:
            holder, new = registry.lease_holder(where, lambda: Conn(sock, timeout, owner))
        except OSError as e:
            if again or relocate is None or e.errno not in _STALE:
                raise
            where = relocate()
            continue
        conn = holder.conn
        try:
            return holder, send(conn)
        except BaseException as e:
            registry.checkin(holder)
            if not again and not new and conn.closed and not getattr(e, "gdsfs_answer", False):
                continue
            _drop_if_pressed(e, sock)
            raise


def _fresh(path, socket, timeout, dev, extra, located=None):
    """Lease path on a connection of the process's pool for its daemon
    (_pooled); located: what _locate said of it just before. A connection
    of the pool the daemon closed meanwhile (it restarted), or a remembered
    socket no daemon answers on, is tried once more afresh."""
    sock, rel, owner, remembered = located or _locate(path, socket)

    def relocate():
        nonlocal sock, rel, owner
        _located.clear()  # the daemon restarted or the mount moved: look again
        sock, rel, owner, _ = _locate(path, socket)
        return sock, owner, timeout

    def send(conn):
        return conn.request(_acquire(rel, dev, **extra), path=path)  # rel as relocate left it

    holder, (resp, fds) = _pooled((sock, owner, timeout), send, relocate if remembered else None)
    conn = holder.conn
    try:
        m = registry.adopt(holder, (sock, rel, dev), resp, fds, path)
    except BaseException:
        _give_back(conn, resp, resp.get("epoch"))
        raise
    finally:
        registry.checkin(holder)
    if not resp.get("cache"):
        registry.flush(sock)  # the daemon is short of room
    return Lease(m, conn, resp, path)


def open(path, *, socket=None, timeout=None, device=None, room_wait=None,  # noqa: A001 (gdsfs.open)
         resident=False, identity=False):
    """Lease the staged bytes of path, a file under a gdsfs mount (staging
    it first if needed), and map them. A file this process keeps mapped
    from an earlier lease is leased again in one round trip, with no
    descriptors, if it has not changed. socket: the lease socket of path's
    mount (default: env GDSFS_SOCKET, else the mount's .gdsfs/socket); its
    listener must be the mount's owner (UntrustedDaemonError).
    timeout: seconds for socket operations (default: wait as long as the
    daemon does, bounded by its ipc.acquire_timeout; connecting takes at
    most gdsfs._proto.CONNECT_TIMEOUT). device: where the lease should be ("GPU-...",
    "host1", an ordinal of the daemon's staging.gpus; "" for none); default:
    the CUDA device this process runs on (gdsfs._device), so a daemon
    staging onto several GPUs leases the replica on this one. room_wait:
    seconds the daemon may wait for room (its capacity, or the uid's
    ipc.max_held_per_uid, held by other leases) before refusing with
    ENOSPC or EDQUOT; staging the file is still bounded by
    ipc.acquire_timeout alone. None (the default): ipc.acquire_timeout
    bounds the wait too. resident: lease only a file resident now; one
    that is not raises OSError(ENODATA) and is not staged. identity: the
    lease's `identity` says which file it holds (PROTOCOL.md). A daemon
    that does not know resident, identity or room_wait refuses them
    (OSError EINVAL naming the field)."""
    dev = _resolve_device(device)
    extra = room_wait_fields(room_wait)
    if resident:
        extra["resident"] = True
    if identity:
        extra["identity"] = True
    located = _locate(path, socket)
    sock, rel = located[:2]
    m = registry.take((sock, rel, dev))
    if m is not None:
        try:
            return _repeat(m, sock, rel, path, dev, extra)
        except BaseException as e:
            registry.discard(m)
            if not isinstance(e, OSError) or not _retry(e):
                raise
        located = None  # the repeat failed: look again
    return _fresh(path, socket, timeout, dev, extra, located)


def stat(path, *, socket=None, timeout=None):
    """The daemon's view of path without staging it: a dict with size,
    state (e.g. "resident", "absent"), load_path, ..."""
    t = find(path, socket)
    conn = Conn(t.socket, timeout, t.owner)
    try:
        resp, _ = conn.request({"op": "stat", "path": t.rel}, path=path)
    finally:
        conn.close()
    out = {k: v for k, v in resp.items() if k != "ok"}
    out.setdefault("size", 0)
    out.setdefault("state", "")
    out.setdefault("load_path", "")
    return out


def load(path, dtype=None, shape=None, offset=0, *, socket=None, timeout=None, device=None, room_wait=None):
    """A zero-copy torch tensor of path's staged bytes (see Lease.tensor).
    The lease is released when the tensor, and every view of it, is
    garbage-collected."""
    _import_torch()
    lease = open(path, socket=socket, timeout=timeout, device=device, room_wait=room_wait)
    try:
        t = lease.tensor(dtype, shape, offset)
    except BaseException:
        lease.close()
        raise
    lease.close()  # takes effect when the tensor is gone
    return t

