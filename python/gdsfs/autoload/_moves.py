"""CPU tensors moved to a GPU, served from a lease when their memory is a
mapping of a file under a gdsfs mount.

Tensor.to, Tensor.cuda and Tensor.copy_ are wrapped. Where the source is a
CPU tensor whose address range lies in a mapping of a file on a gdsfs
mount (_maps: decided from the memory, not from which call made the
tensor), the same tensor (dtype, shape, strides, storage offset into the
file) is viewed in the file's lease and copied from there, device to
device. Where the bytes at those addresses may not be the file's (pages of
a private mapping written in memory, a file changed since it was mapped, a
shared writable mapping) or the lease cannot serve (refused, staged on the
host), the original call runs, counted by reason.

Moves into CPU memory are served only where TARGETS names "cpu" (the host
backend's tests: a host lease stands in for the GPU there)."""

import atexit
import os
import stat as _stat
import sys
import threading
import time

from .._registry import registry
from . import _ahead, _maps, _report, _serve
from ._serve import Fallback

TARGETS = ("cuda",)
MAX_LEASES = 64  # leases kept open, least recently used closed first

_lock = threading.Lock()
_leases = {}  # (dev, ino, ident) -> _Kept, least recently used first
_orig = {}  # name -> the Tensor method wrapped
_gens = {}  # (dev, ino, ident) -> the generation first leased: a file staged again has changed
_inflight = {}  # (dev, ino) -> threading.Event set once the lease a move or _ahead is taking of it is done


# --- the wrappers -----------------------------------------------------------

def install(torch):
    """Wrap Tensor.to, .cuda, .copy_ and the mapping calls torch has."""
    from . import _hooks

    T = torch.Tensor
    if getattr(T.to, "_gdsfs_original", None) is not None:
        return
    orig_to, orig_cuda, orig_copy = T.to, T.cuda, T.copy_
    _orig.update(to=orig_to, cuda=orig_cuda, copy_=orig_copy)

    # The fast path, for every call: the data pointer against the index's
    # span, and whether a miss may look further (a hooked mapping not
    # indexed yet, or a rebuild due and a tensor that may be large enough).
    # Nothing else runs for memory that is not a mapping of a gdsfs file.
    maps, mono = _maps, time.monotonic

    def to(self, *args, **kwargs):
        try:
            p = self.data_ptr()
        except Exception:
            p = -1
        lo, hi = maps.span
        if lo <= p < hi or p > 0 and (maps.dirty or maps.discover_at <= mono() and self.numel() >= maps.DISCOVER_NUMEL):
            out = _try(torch, "torch.Tensor.to", self, _to_target, (torch, self, args, kwargs))
            if out is not None:
                return out
        return orig_to(self, *args, **kwargs)

    def cuda(self, *args, **kwargs):
        try:
            p = self.data_ptr()
        except Exception:
            p = -1
        lo, hi = maps.span
        if lo <= p < hi or p > 0 and (maps.dirty or maps.discover_at <= mono() and self.numel() >= maps.DISCOVER_NUMEL):
            out = _try(torch, "torch.Tensor.cuda", self, _cuda_target, (torch, self, args, kwargs))
            if out is not None:
                return out
        return orig_cuda(self, *args, **kwargs)

    def copy_(self, src, *args, **kwargs):
        try:
            p = src.data_ptr()
        except Exception:
            p = -1
        lo, hi = maps.span
        if lo <= p < hi or p > 0 and (maps.dirty or maps.discover_at <= mono() and src.numel() >= maps.DISCOVER_NUMEL):
            out = _try(torch, "torch.Tensor.copy_", src, _copy_target, (torch, self, src, args, kwargs, orig_copy))
            if out is not None:
                return out
        return orig_copy(self, src, *args, **kwargs)

    for name, fn, orig in (("to", to, orig_to), ("cuda", cuda, orig_cuda), ("copy_", copy_, orig_copy)):
        fn.__name__ = fn.__qualname__ = name
        fn.__doc__ = getattr(orig, "__doc__", None)
        fn._gdsfs_original = orig
        _hooks.replace(T, name, fn)
    _wrap_mapper(_hooks, torch, "from_file", _tensor_mapped)
    for cls in (getattr(torch, "UntypedStorage", None), getattr(torch, "ByteStorage", None)):
        if cls is not None and hasattr(cls, "from_file"):
            _wrap_mapper(_hooks, cls, "from_file", _storage_mapped, static=True)


def _shared_arg(args, kwargs):
    return bool(kwargs.get("shared", args[1] if len(args) > 1 else False))


def _tensor_mapped(t, args, kwargs):
    """torch.from_file's tensor: (start, length, offset, shared, writable)
    of its mapping (the file from offset 0, readable and writable)."""
    st = _serve.ustorage(t)
    return st.data_ptr(), st.nbytes(), 0, _shared_arg(args, kwargs), True


def _storage_mapped(s, args, kwargs):
    """UntypedStorage.from_file's (ByteStorage's on torch 1.x) storage,
    which owns its mapping (it has no way to let it go while it lives)."""
    n = s.nbytes() if hasattr(s, "nbytes") else s.size() * s.element_size()
    return s.data_ptr(), n, 0, _shared_arg(args, kwargs), True, s


def _memmap_mapped(arr, args, kwargs):
    """np.memmap's array: numpy maps from the offset rounded down to the
    allocation granularity, shared for modes r, r+, w+, private for c; its
    mmap.mmap owns the mapping (until closed)."""
    import mmap

    import numpy

    mm = getattr(arr, "_mmap", None)
    if mm is None or not len(mm):
        return None
    start = numpy.frombuffer(mm, dtype=numpy.uint8).ctypes.data
    off = int(getattr(arr, "offset", 0) or 0)
    mode = getattr(arr, "mode", "r")
    return start, len(mm), off - off % mmap.ALLOCATIONGRANULARITY, mode != "c", mode != "r", mm


def install_numpy(numpy):
    """np.memmap (np.load(mmap_mode=...) makes one) tells the index."""
    from . import _hooks

    mm = getattr(numpy, "memmap", None)
    new = getattr(mm, "__new__", None)
    if new is None or getattr(new, "_gdsfs_original", None) is not None:
        return

    def __new__(subtype, filename, *args, **kwargs):
        st = _maps.note(filename)
        arr = new(subtype, filename, *args, **kwargs)
        _index_new(st, _memmap_mapped, arr, args, kwargs)
        return arr

    __new__._gdsfs_original = new
    _hooks.replace(mm, "__new__", staticmethod(__new__))


def _index_new(st, describe, result, args, kwargs):
    """Index the mapping a hooked call made (see _maps.mapped)."""
    if st is None:
        return
    try:
        where = describe(result, args, kwargs)
    except Exception:
        where = None
    if where is None:
        _maps.mapped(_maps.UNKNOWN, 0, 0, 0, False, False)
        return
    e = _maps.mapped(st, *where)
    if e is not None and _ahead.AHEAD > 0:
        dev = _cuda_device()
        if dev is not None or "cpu" in TARGETS:
            try:
                _ahead.seen(e.path, dev)
            except Exception:  # never the caller's problem (no thread to be had, say)
                _report.log.debug("gdsfs autoload: leasing ahead of %s", e.path, exc_info=True)


def _cuda_device():
    """The CUDA ordinal current in this thread, or None where this process
    has not initialized CUDA (or is a child forked after it did)."""
    torch = sys.modules.get("torch")
    try:
        if torch is None or "cuda" not in TARGETS or not torch.cuda.is_initialized():
            return None
        return torch.cuda.current_device()
    except Exception:
        return None


def _wrap_mapper(hooks, owner, name, describe, static=False):
    orig = getattr(owner, name, None)
    if orig is None or getattr(orig, "_gdsfs_original", None) is not None:
        return

    def mapper(*args, **kwargs):
        st = _maps.note(args[0] if args else kwargs.get("filename"))
        out = orig(*args, **kwargs)
        _index_new(st, describe, out, args, kwargs)
        return out

    mapper.__name__ = mapper.__qualname__ = name
    mapper._gdsfs_original = orig
    try:
        hooks.replace(owner, name, staticmethod(mapper) if static else mapper)
    except (AttributeError, TypeError):
        _report.log.warning("gdsfs autoload: cannot wrap %s.%s; mappings it makes are found later",
                            getattr(owner, "__name__", owner), name)


# --- deciding -------------------------------------------------------------

def _try(torch, loader, src, target_fn, targs):
    """The served result, or None for the original call (a fallback is
    counted where src is a mapping of a gdsfs file)."""
    if type(src) is not torch.Tensor and type(src) is not torch.nn.Parameter or not src.is_cpu:
        return None
    try:
        p = src.data_ptr()
        e = _maps.find(p)
        if e is None:
            e = _maps.after_miss(p, src)
            if e is None:
                return None
    except Exception:
        return None  # no plain data pointer (sparse, mkldnn): the original call decides
    if src.numel() == 0 or _serve.bypassed():
        return None
    try:
        plan = target_fn(*targs)
    except Fallback as f:
        _report.fallback(loader, f.reason, e.path, f.socket, f.detail)
        return None
    except Exception:
        return None  # arguments the original call judges (and raises for)
    if plan is None:
        return None
    try:
        out = plan(lambda lease_ok: _source(torch, src, e, lease_ok))
    except Fallback as f:
        if f.reason is not None:
            _report.fallback(loader, f.reason, e.path, f.socket, f.detail)
        return None
    except Exception as x:  # never the caller's problem: the original call runs
        _report.fallback(loader, "client-error:" + type(x).__name__, e.path, None, str(x))
        return None
    _report.count_served(loader)
    return out


def _device_ok(gpu, dev):
    """Whether bytes staged on a GPU (gpu True) or in host memory serve a
    move to dev."""
    if dev.type == "cuda":
        return gpu
    return dev.type == "cpu" and not gpu


def _target(torch, dev):
    """dev as a torch.device when a move there is served, else None."""
    if dev is None:
        return None
    dev = torch.device(dev)
    if dev.type not in TARGETS:
        return None
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def _check_grad(torch, *ts):
    if torch.is_grad_enabled() and any(t.requires_grad for t in ts):
        raise Fallback("requires-grad")


def _check_dtypes(torch, a, b):
    """A conversion served on the GPU gives the plain call's values for
    floating types; others (integer overflow, bool) stay with torch's CPU
    conversion."""
    if a != b and not (a.is_floating_point and b.is_floating_point):
        raise Fallback("dtype-conversion")


def _to_target(torch, src, args, kwargs):
    kwargs = dict(kwargs)
    copy = kwargs.pop("copy", False)
    try:
        dev, dtype, non_blocking, mf = torch._C._nn._parse_to(*args, **kwargs)
    except Exception:
        return None  # the original raises what it raises
    dev = _target(torch, dev if dev is not None else src.device)
    if dev is None or type(src) not in (torch.Tensor, torch.nn.Parameter):
        return None
    dtype = dtype or src.dtype
    if dev.type == "cpu" and dtype == src.dtype and not copy:
        return None  # the original returns src itself
    _check_grad(torch, src)
    if dev.type == "cuda":
        _check_dtypes(torch, src.dtype, dtype)
    mf = torch.preserve_format if mf is None else mf

    def plan(source):
        v = source(lambda gpu: _device_ok(gpu, dev))
        return _orig["to"](v, device=dev, dtype=dtype, non_blocking=non_blocking, copy=True, memory_format=mf)
    return plan


def _cuda_target(torch, src, args, kwargs):
    if type(src) not in (torch.Tensor, torch.nn.Parameter) or "cuda" not in TARGETS:
        return None
    names = ("device", "non_blocking", "memory_format")
    if len(args) > len(names) or any(k not in names for k in kwargs):
        return None
    a = dict(zip(names, args), **kwargs)
    d = a.get("device")
    try:
        dev = torch.device("cuda", d) if isinstance(d, int) else _target(torch, d if d is not None else "cuda")
    except Exception:
        return None
    if dev is None or dev.type != "cuda":
        return None
    _check_grad(torch, src)
    mf = a.get("memory_format", torch.preserve_format)

    def plan(source):
        v = source(lambda gpu: _device_ok(gpu, dev))
        return _orig["to"](v, device=dev, non_blocking=bool(a.get("non_blocking", False)), copy=True,
                           memory_format=mf)
    return plan


def _copy_target(torch, dst, src, args, kwargs, orig_copy):
    if not isinstance(dst, torch.Tensor) or dst.device.type not in TARGETS or dst.is_cpu and "cpu" not in TARGETS:
        return None
    if dst.layout != torch.strided or dst.is_quantized:
        return None
    _check_grad(torch, dst, src)
    if dst.device.type == "cuda":
        _check_dtypes(torch, src.dtype, dst.dtype)
    dev = dst.device

    def plan(source):
        v = source(lambda gpu: _device_ok(gpu, dev))
        orig_copy(dst, v, *args, **kwargs)
        return dst
    return plan


# --- serving --------------------------------------------------------------

def _source(torch, src, e, lease_ok):
    """src viewed in its file's lease (same dtype, shape, strides), or
    Fallback."""
    if src.layout != torch.strided or src.is_quantized or src.is_conj() or src.is_neg():
        raise Fallback(None)
    item = src.element_size()
    if src.is_contiguous():
        span = src.numel() * item
    elif any(s < 0 for s in src.stride()):
        raise Fallback(None)
    else:
        span = (sum((n - 1) * s for n, s in zip(src.shape, src.stride())) + 1) * item
    lo = src.data_ptr()
    hi = lo + span
    # what is mapped at lo now decides (file, offset, shared or private),
    # not what the index holds: the mapping may have been replaced in place
    v = _maps.vma_at(lo, e.dev)
    if v is None or v.key != e.key:
        _maps.refresh()
        e = _maps.find(lo)
        if e is None:
            raise Fallback(None)  # not a gdsfs file's memory any more
        v = _maps.vma_at(lo, e.dev)
        if v is None or v.key != e.key:
            raise Fallback(None)
    if hi > v.end:
        raise Fallback("spans-mappings")
    if v.shared and v.writable:
        raise Fallback("mapping-shared-writable")
    ident = _identity(e)
    off = v.offset + (lo - v.start)
    if off + span > ident[0]:
        raise Fallback("beyond-eof")
    if not v.shared:
        w = _maps.written_pages(lo, hi)
        if w is None:
            raise Fallback("pagemap-unreadable")
        if w:
            raise Fallback("private-pages-written", None, "%d of the pages under the tensor" % w)
    kept = _kept(e, ident)
    if kept is None:
        gpu = _serve.mount_is_gpu(e.path)  # known without a lease, which would stage the file
        if gpu is not None and not lease_ok(gpu):
            raise Fallback("host-staged" if not gpu else "device")
        kept = _lease(e, ident)
    kept.ahead = False
    lease = kept.lease
    if not lease_ok(lease.is_gpu):
        raise Fallback("host-staged" if not lease.is_gpu else "device", _serve.socket_of(lease))
    if off % item == 0:
        w = kept.typed(torch, src.dtype, item)  # one view of the whole file per dtype: a move makes one view
        v = torch.as_strided(w, src.shape, src.stride(), off // item)
    else:  # not element-aligned in the file: an aligned copy on the lease's device
        v = kept.whole(torch)[off:off + span].clone().view(src.dtype)
        v = v.as_strided(src.shape, src.stride(), 0)
    if lease.is_gpu:
        kept.devices.add(v.device)
    return v


def _identity(e):
    """The file's identity now, checked against the one it had when it was
    mapped (or first seen mapped); Fallback("file-changed") if it differs."""
    try:
        st = os.stat(e.path)
    except OSError as err:
        raise Fallback("file-changed", None, str(err)) from None
    now = (st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    was = _maps.ident_of(e.key)
    if (st.st_dev, st.st_ino) != e.key or was is None or was != now:
        _drop(e.key)
        raise Fallback("file-changed")
    return now


class _Kept:
    """A lease kept open across moves and mappings of its file (until the
    file changes, MAX_LEASES newer ones are kept, the daemon is short of
    room, or the process ends), and a uint8 tensor over the whole file in
    it (made once: views of it are cheap)."""

    __slots__ = ("lease", "devices", "_whole", "_typed", "ahead")

    def __init__(self, lease, ahead=False):
        self.lease = lease
        self.ahead = ahead  # taken ahead, no move served from it yet
        self.devices = set()  # CUDA devices copied to: synchronized before closing
        self._whole = None
        self._typed = {}  # dtype -> the whole file's whole elements of it

    def whole(self, torch):
        w = self._whole
        if w is None:
            w = self._whole = self.lease.tensor(torch.uint8)
        return w

    def typed(self, torch, dtype, item):
        """The file's bytes as elements of dtype (item bytes each), from
        offset 0 (a tail shorter than one element left out)."""
        t = self._typed.get(dtype)
        if t is None:
            w = self.whole(torch)
            t = self._typed[dtype] = w[:w.numel() - w.numel() % item].view(dtype)
        return t

    def close(self):
        self._whole = None
        self._typed = {}
        if self.devices:
            import torch

            for d in self.devices:
                torch.cuda.synchronize(d)
        self.lease.close()


def _after_fork_in_child():
    """In a forked child the parent's kept leases are not ours to use or
    close (the registry closes the child's copies of their connections):
    start afresh."""
    global _lock
    _lock = threading.Lock()  # another thread of the parent may have held it
    _leases.clear()
    _gens.clear()
    _inflight.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _kept(e, ident):
    """The _Kept of e's file if it is leased already, else None."""
    key = e.key + (ident,)
    with _lock:
        kept = _leases.pop(key, None)
        if kept is not None:
            _leases[key] = kept  # most recently used last
        return kept


def _lease(e, ident, ahead=False, resident=False):
    """The _Kept of e's file, leased on first use. Where the daemon refuses
    it for room (the capacity, or the uid's bound on held bytes) while this
    process keeps other leases, those are closed and it is asked once more:
    the kept leases never stand in the way of a file being moved now. A
    grant that says the daemon is short of room ("cache": false) closes the
    other kept leases too, and so does a refusal for the uid's connections
    (EMFILE), after which this move falls back. ahead: a lease _ahead takes
    before any move asks (no other kept lease is closed for it; one short
    of room is closed and None returned); a move waits for a lease of its
    file in progress (another move's or _ahead's) rather than take a
    second, and _ahead takes none of a file a move is leasing.
    resident: the daemon is asked for a file resident now only (what
    _ahead leases)."""
    kept = _kept(e, ident)
    if kept is not None:
        return kept
    key = e.key + (ident,)
    mine = None
    if not ahead:
        with _lock:
            taking = _inflight.get(e.key)
            if taking is None:  # a lease ahead of this file does not start while the move leases it
                mine = _inflight[e.key] = threading.Event()
        if taking is not None:
            taking.wait()
            kept = _kept(e, ident)
            if kept is not None:
                return kept
    try:
        return _take(e, ident, key, ahead, resident)
    finally:
        if mine is not None:
            with _lock:
                if _inflight.get(e.key) is mine:
                    del _inflight[e.key]
            mine.set()


def _take(e, ident, key, ahead, resident):
    """_lease's lease of e's file, once no other is being taken."""
    _drop(e.key, keep=key, path=e.path)  # an older version of the file: not to be served again
    try:
        lease = _serve.acquire(e.path, resident)
    except Fallback as f:
        if ahead or f.reason not in ("refused:EMFILE", "refused:ENOSPC", "refused:EDQUOT") or not leases_kept():
            raise
        lease = None
        if f.reason != "refused:EMFILE" and _drop_unused_ahead():
            registry.flush()  # a closed lease's mapping is kept idle there, its bytes held
            try:  # the room leases ahead held, given back first: the moves' leases stay
                lease = _serve.acquire(e.path)
            except Fallback:
                pass
        if lease is None:
            release()
            registry.flush()  # the mappings gdsfs.open keeps hold their bytes and connections too
            if f.reason == "refused:EMFILE":
                # Each kept lease holds a connection, counted against the uid's
                # ipc.max_connections_per_uid: kept, they would refuse every
                # file not kept yet for as long as the process lives. Closed,
                # the next moves get a connection; this one falls back (the
                # daemon ends connections asynchronously, so asking again at
                # once could still be refused).
                raise
            lease = _serve.acquire(e.path)
    if len(_gens) > 4096:  # files leased once, long ago
        with _lock:
            for k in [k for k in _gens if k not in _leases]:
                del _gens[k]
    with _lock:  # _drop walks _gens under it, in another thread too
        gen = _gens.setdefault(key, lease.generation)
    if lease.size != ident[0] or lease.generation != gen:
        lease.close()
        raise Fallback("file-changed", _serve.socket_of(lease))
    _check_leased_file(e, ident, lease)
    old = []
    with _lock:
        if ahead and (not lease._m.cache or len(_leases) >= MAX_LEASES):
            # the daemon is short of room, or keeping it would end another kept lease
            old.append(_Kept(lease))
            kept = None
        else:
            if not lease._m.cache:  # the daemon is short of room: keep no other file
                old += [_leases.pop(k) for k in list(_leases) if k != key]
            kept = _leases.get(key)
            if kept is not None:  # another thread leased it meanwhile: keep one
                old.append(_Kept(lease))
            else:
                kept = _leases[key] = _Kept(lease, ahead)
            while len(_leases) > MAX_LEASES:
                old.append(_leases.pop(next(iter(_leases))))
    _close(old)
    return kept


class _Named:
    """What _lease needs of a file no mapping showed yet: its path and key."""

    __slots__ = ("path", "key")

    def __init__(self, path, key):
        self.path, self.key = path, key


def lease_ahead(path):
    """Lease path for moves to come (_ahead's worker), and view it as
    bytes (what a move's first view of the file would make): a regular
    file (not a symbolic link) resident on the mount, staged where this
    process's moves are served, not kept yet and not mapped before as
    another version. Whatever stops it is no fallback: no move asked."""
    try:
        st = os.lstat(path)
    except OSError:
        return
    if not _stat.S_ISREG(st.st_mode) or st.st_size == 0:
        return
    key, ident = (st.st_dev, st.st_ino), _maps.identity(st)
    if _kept(_Named(path, key), ident) is not None or _maps.ident_of(key) not in (None, ident):
        return
    gpu = _serve.mount_is_gpu(path)
    if gpu is None or not gpu and "cpu" not in TARGETS:
        return
    resident = _serve.knows_resident(path)  # the daemon refuses a file not resident
    if not resident:  # an older daemon: the mount says
        try:
            if os.getxattr(path, "user.gdsfs.state") != b"resident":
                return  # a lease would stage it
        except OSError:
            return
    done = threading.Event()
    with _lock:
        if key in _inflight:
            return
        _inflight[key] = done
    kept = None
    try:
        if _maps.remember(key, ident):
            kept = _lease(_Named(path, key), ident, ahead=True, resident=resident)
        torch = sys.modules.get("torch")
        if kept is not None and torch is not None:
            kept.whole(torch)
    except Fallback:
        pass
    finally:
        if kept is None:
            _maps.forget(key, ident)
        with _lock:
            _inflight.pop(key, None)
        done.set()


def _check_leased_file(e, ident, lease):
    """Fallback (the lease closed) unless the lease, asked for by path,
    holds e's file: the kernel may answer a stat of the path from its cache
    for a while after SOURCE's file was replaced (renamed over), so
    _identity's check cannot tell, while the daemon staged the file the
    path names in SOURCE. The daemon's grant says which file it holds
    (Lease.identity: the mount's inode number, size and times), compared
    with e's key and ident. From a daemon that does not say, its
    user.gdsfs.state of the node the path reaches tells: an error (ESTALE,
    ENOENT) once SOURCE's path names another file; where the kernel looked
    the name up again, the node is the new file's, which _identity tells
    from e's. Checked after the lease was taken, so a file replaced before
    the lease is caught too."""
    held = lease.identity
    if held is not None:
        if held == (e.key[1],) + tuple(ident):
            return
        lease.close()
        _drop(e.key)
        reason = "file-replaced" if held[0] != e.key[1] else "file-changed"
        raise Fallback(reason, _serve.socket_of(lease), "the daemon leased inode %d (size, mtime_ns, ctime_ns %r), the "
                       "mapping is of inode %d (%r)" % (held[0], held[1:], e.key[1], tuple(ident)))
    try:
        os.getxattr(e.path, "user.gdsfs.state")
        if _identity(e) != ident:
            raise Fallback("file-changed")
    except OSError as err:
        lease.close()
        _drop(e.key)
        raise Fallback("file-replaced", _serve.socket_of(lease), str(err)) from None
    except Fallback as f:
        lease.close()
        f.socket = f.socket or _serve.socket_of(lease)
        raise


def _drop(key, keep=None, path=None):
    """Close the kept leases of file key (dev, ino), or of path, but keep's."""
    with _lock:
        ks = [k for k in _leases if k != keep and (k[:2] == key or _leases[k].lease.path == path)]
        gone = [_leases.pop(k) for k in ks]
        for k in [k for k in _gens if k[:2] == key and k != keep] + ks:
            _gens.pop(k, None)
    _close(gone)


def _drop_unused_ahead():
    """Close the kept leases taken ahead that no move used yet; whether any were."""
    with _lock:
        ks = [k for k, v in _leases.items() if v.ahead]
        gone = [_leases.pop(k) for k in ks]
    _close(gone)
    return bool(gone)


def release():
    """Close every kept lease, once the copies queued from them are done
    (disable(), the process's exit, a move short of room), after the lease
    being taken ahead, if any (and none is taken ahead of what was mapped
    before)."""
    _ahead.stop()
    with _lock:
        gone = list(_leases.values())
        _leases.clear()
        _gens.clear()
    _close(gone)


atexit.register(release)  # before the interpreter (and CUDA) tear down


def _close(kepts):
    for k in kepts:
        try:
            k.close()
        except Exception:
            _report.log.debug("gdsfs autoload: closing a kept lease", exc_info=True)


def leases_kept():
    with _lock:
        return len(_leases)
