"""torch.load of torch.save zip checkpoints served from a lease.

torch's own load runs unchanged (argument handling, weights_only and its
restricted unpickler, map_location, byte order): while a served call runs on
this thread, two names in torch.serialization answer for it:
- _open_zipfile_reader gives torch a reader over the lease (records located
  from the zip central directory, storages handed out as views of the lease);
- _get_restore_location wraps torch's restore function so each such storage
  lands on the device torch would put it on, as a copy out of the lease
  (device to device on a GPU mount).
Everything else, and every other call, goes to torch's own code."""

import functools
import inspect
import os
import threading

from . import _report, _serve, _zipdir
from ._serve import Fallback

_tls = threading.local()
LOADER = "torch.load"


class _Ctx:
    """One served torch.load: the lease, its records, the storages handed out."""

    def __init__(self, torch, lease, recs, path, mmap):
        self.torch = torch
        self.lease = lease
        self.recs = recs
        self.path = path
        self.mmap = mmap
        self.claimed = False
        self.zero = _serve.zero_copy()
        self.views = {}  # (device, data_ptr) -> (view tensor, record)
        self.used = set()
        self.file_fd = None
        self.file_storage = None
        self.cpu_from_file = False

    def close(self):
        try:
            _serve.sync(self.torch, self.used)
        finally:
            self.views.clear()
            if self.file_fd is not None:
                os.close(self.file_fd)
                self.file_fd = None
            self.file_storage = None
            self.lease.close()

    # the reader torch sees ----------------------------------------------
    def record(self, name):
        try:
            return self.recs[name]
        except KeyError:
            raise RuntimeError("PytorchStreamReader failed locating file %s: file not found" % name) from None

    def storage_view(self, name, nbytes):
        torch = self.torch
        r = self.record(name)
        if nbytes > r.size:
            raise RuntimeError("gdsfs: record %s holds %d bytes, %d asked" % (name, r.size, nbytes))
        if nbytes == 0:
            return torch.empty(0, dtype=torch.uint8)
        v = self.lease.tensor(torch.uint8, (nbytes,), r.offset)
        self.views[(v.device, v.data_ptr())] = (v, r)
        return v

    # restoring ----------------------------------------------------------
    def restorer(self, restore, map_location):
        target = _target_fn(map_location)

        def restore_location(storage, location):
            hit = self.views.get((storage.device, storage.data_ptr()))
            if hit is None:
                return restore(storage, location)
            view, rec = hit
            where = target(location)
            dev = None
            if where is not None:
                try:
                    dev = self.torch.device(where)
                except (TypeError, ValueError, RuntimeError):
                    dev = None
            if dev is not None and dev.type == "cuda" and self.lease.is_gpu:
                return self._to_cuda(view, dev)
            # The storage torch would have read, and torch's restore: it
            # runs the deserializers registered for the location, refuses
            # what it refuses ("cpu:0"), and decides for callables and
            # other devices.
            return restore(self._to_cpu(view, rec), location)

        return restore_location

    def _to_cuda(self, view, dev):
        torch = self.torch
        idx = dev.index if dev.index is not None else torch.cuda.current_device()
        if self.zero and idx == self.lease.ordinal:
            return _serve.ustorage(view)
        out = torch.empty(view.numel(), dtype=torch.uint8, device=torch.device("cuda", idx))
        out.copy_(view)
        self.used.add(out.device)
        return _serve.ustorage(out)

    def _to_cpu(self, view, rec):
        torch = self.torch
        if not self.lease.is_gpu:
            if self.zero:
                return _serve.ustorage(view)
            out = torch.empty(view.numel(), dtype=torch.uint8)
            out.copy_(view)
            return _serve.ustorage(out)
        if _serve.cpu_policy() == "lease":
            out = torch.empty(view.numel(), dtype=torch.uint8)
            out.copy_(view)
            return _serve.ustorage(out)
        return self._from_file(view.numel(), rec)

    def _from_file(self, nbytes, rec):
        """What torch itself would do for a CPU storage: read the record
        from the file (or slice its mmap when mmap=True was asked)."""
        torch = self.torch
        if not self.cpu_from_file:
            self.cpu_from_file = True
            _report.fallback(LOADER, "cpu-target-gpu-staged", self.path, _serve.socket_of(self.lease))
        if self.mmap:
            if self.file_storage is None:
                from torch.serialization import MAP_SHARED, get_default_mmap_options

                shared = get_default_mmap_options() == MAP_SHARED
                self.file_storage = torch.UntypedStorage.from_file(self.path, shared, self.lease.size)
            return self.file_storage[rec.offset:rec.offset + nbytes]
        if self.file_fd is None:
            self.file_fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        out = torch.empty(nbytes, dtype=torch.uint8)
        mv = memoryview(out.numpy()).cast("B")
        got = 0
        while got < nbytes:
            n = os.preadv(self.file_fd, [mv[got:]], rec.offset + got)
            if n <= 0:
                raise OSError("gdsfs: %s ended at %d reading %s" % (self.path, rec.offset + got, rec.name))
            got += n
        return _serve.ustorage(out)


def _target_fn(map_location):
    """location -> where torch's default restore puts it, or None when only
    torch knows (a callable map_location)."""
    import torch

    if map_location is None:
        return lambda loc: loc
    if isinstance(map_location, dict):
        return lambda loc: map_location.get(loc, loc)
    if isinstance(map_location, str):
        return lambda loc: map_location
    if isinstance(map_location, torch.device):
        return lambda loc: str(map_location)
    return lambda loc: None


class _Reader:
    """The subset of torch._C.PyTorchFileReader that torch.serialization
    uses, over the lease."""

    def __init__(self, ctx):
        self._c = ctx

    def has_record(self, name):
        return name in self._c.recs

    def get_record(self, name):
        r = self._c.record(name)
        return self._c.lease.read(r.offset, r.size)

    def get_all_records(self):
        return list(self._c.recs)

    def get_storage_from_record(self, name, numel, dtype):
        return self._c.storage_view(name, numel)

    def get_record_offset(self, name):
        return self._c.record(name).offset

    def get_record_header_offset(self, name):
        return self._c.record(name).header_offset

    def get_record_offset_no_read(self, zipfile_header_offset, filename, size, storage_alignment):
        return self._c.record(filename).offset

    def serialization_id(self):
        r = self._c.recs.get(".data/serialization_id")
        return self._c.lease.read(r.offset, r.size).decode() if r else ""

    def get_storage_alignment(self):
        return 64


def _active():
    return getattr(_tls, "ctx", None)


def install(serialization, torch_module=None):
    """Patch torch.serialization (and torch.load) in place; idempotent."""
    if getattr(serialization.load, "_gdsfs_original", None) is not None:
        return
    import torch

    orig_load = serialization.load
    orig_reader = serialization._open_zipfile_reader
    orig_grl = serialization._get_restore_location

    opener_init = getattr(serialization, "_opener", orig_reader.__mro__[1]).__init__

    class _open_zipfile_reader(orig_reader):
        # Not super().__init__: torch 1.13's names _open_zipfile_reader,
        # which is this class now. Its body is this one line in 1.13 and 2.x.
        def __init__(self, name_or_buffer):
            ctx = _active()
            if ctx is not None and not ctx.claimed:
                ctx.claimed = True
                opener_init(self, _Reader(ctx))
                return
            opener_init(self, torch._C.PyTorchFileReader(name_or_buffer))

    _open_zipfile_reader.__qualname__ = orig_reader.__qualname__

    @functools.wraps(orig_grl)
    def _get_restore_location(map_location):
        restore = orig_grl(map_location)
        ctx = _active()
        return restore if ctx is None else ctx.restorer(restore, map_location)

    sig = inspect.signature(orig_load)
    has_mmap = "mmap" in sig.parameters

    @functools.wraps(orig_load)
    def load(*args, **kwargs):
        if _serve.bypassed():
            return orig_load(*args, **kwargs)
        try:
            ba = sig.bind(*args, **kwargs)
        except TypeError:
            return orig_load(*args, **kwargs)
        prev = _active()
        try:
            ctx = _plan(torch, ba.arguments, has_mmap)
        except Fallback as f:
            _report.fallback(LOADER, f.reason, _name(ba.arguments.get("f")), f.socket, f.detail)
            _tls.ctx = None
            try:
                return orig_load(*args, **kwargs)
            finally:
                _tls.ctx = prev
        if has_mmap and ba.arguments.get("mmap"):
            ba.arguments["mmap"] = False
        _tls.ctx = ctx
        try:
            out = orig_load(*ba.args, **ba.kwargs)
            served = ctx.claimed
        finally:
            _tls.ctx = prev
            ctx.close()
        if served:
            _report.count_served(LOADER)
        else:  # torch never opened the zip reader (cannot happen for a zip)
            _report.fallback(LOADER, "not-claimed", ctx.path)
        return out

    from ._hooks import replace

    load._gdsfs_original = orig_load
    replace(serialization, "_open_zipfile_reader", _open_zipfile_reader)
    replace(serialization, "_get_restore_location", _get_restore_location)
    replace(serialization, "load", load)
    if torch_module is not None and getattr(torch_module, "load", None) is orig_load:
        replace(torch_module, "load", load)


def _name(f):
    try:
        return os.fsdecode(os.fspath(f))
    except TypeError:
        return getattr(f, "name", type(f).__name__)


def _plan(torch, a, has_mmap):
    f = a.get("f")
    path = _serve.path_of(f)
    if path is None:
        raise Fallback("not-a-path")
    mmap = bool(has_mmap and a.get("mmap"))
    if mmap and not isinstance(f, (str, os.PathLike)):
        raise Fallback("mmap-file-object")  # torch raises its own error
    lease = _serve.acquire(path)
    try:
        try:
            recs = _zipdir.records(lease.read, lease.size)
        except _zipdir.ZipError as e:
            raise Fallback(e.reason, _serve.socket_of(lease), str(e)) from None
        if "constants.pkl" in recs:
            raise Fallback("format:torchscript", _serve.socket_of(lease))
        if "data.pkl" not in recs:
            raise Fallback("format:no-data.pkl", _serve.socket_of(lease))
        _check_version(lease, recs)
        if not isinstance(f, (str, bytes, os.PathLike)):
            _check_same_file(f, lease)
    except BaseException:
        lease.close()
        raise
    return _Ctx(torch, lease, recs, path, mmap)


# The archive versions torch.save writes (its "version" record); torch
# refuses some others (missing, unparsable, newer than it reads), and any
# other is left to it.
_VERSIONS = (b"1", b"2", b"3")


def _check_version(lease, recs):
    """Fallback unless the archive's version record, the one torch reads
    (.data/version, else version), is one torch.save writes."""
    r = recs.get(".data/version") or recs.get("version")
    if r is None:
        raise Fallback("format:no-version", _serve.socket_of(lease))
    if r.size > 16 or lease.read(r.offset, r.size).strip() not in _VERSIONS:
        raise Fallback("format:version", _serve.socket_of(lease))


def _check_same_file(f, lease):
    """Fallback unless the file object's descriptor is still the file at
    its path, which the lease (asked for by path) holds. The kernel may
    answer a stat of the path from its cache for a while after SOURCE's
    file was replaced (renamed over), so path_of's check cannot tell; the
    daemon can: its user.gdsfs.state of the descriptor's file is an error
    (ESTALE, ENOENT) once the path names another file. Checked after the
    lease was taken, so a file replaced before the lease is caught too."""
    try:
        os.getxattr(f.fileno(), "user.gdsfs.state")
    except OSError as e:
        raise Fallback("file-replaced", _serve.socket_of(lease), str(e)) from None
