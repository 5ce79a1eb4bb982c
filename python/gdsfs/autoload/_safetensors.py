"""safetensors.torch.load_file and safetensors.safe_open served from a lease.

Tensors are copied out of the staged bytes onto the device asked for (a
device-to-device copy on a GPU mount), so the caller owns ordinary writable
tensors; GDSFS_ZERO_COPY=1 hands read-only views of the lease instead."""

import functools
import inspect
import os

from . import _report, _serve, _stformat
from ._serve import Fallback

_PT = ("pt", "torch", "pytorch")


def _torch():
    import torch

    return torch


_BACKENDS = ("mmap", "pread")  # safetensors 0.8's


def _device(torch, device):
    """The torch.device the library would put tensors on, or Fallback for
    anything it does not read as the CPU or a CUDA device. The library
    takes "cpu", "cuda" (cuda:0), "cuda:N" and an int (a CUDA ordinal); it
    refuses a torch.device, "cpu:0" and the like, so those go to it and
    fail there as they would without gdsfs."""
    if isinstance(device, int) and not isinstance(device, bool) and device >= 0:
        return torch.device("cuda", device)
    if device == "cpu":
        return torch.device("cpu")
    if device == "cuda":
        return torch.device("cuda", 0)
    if isinstance(device, str) and device.startswith("cuda:") and device[5:].isdigit() and device[5:].isascii():
        return torch.device("cuda", int(device[5:]))
    raise Fallback("device:%s" % (device,))


def _backend(backend):
    """backend (safetensors 0.8: how the library reads the file) as served,
    or Fallback for a value the library may refuse or read differently."""
    if backend is None:
        return "mmap"
    if backend not in _BACKENDS:
        raise Fallback("backend:%s" % (backend,))
    return backend


def _closed():
    try:
        from safetensors import SafetensorError

        return SafetensorError("File is closed")
    except Exception:
        return RuntimeError("File is closed")


class Served:
    """One safetensors file leased and parsed: what safe_open returns."""

    def __init__(self, lease, header, device, torch, original=None, backend="mmap"):
        self._lease = lease
        self._pathname = getattr(lease, "path", "?")
        self._backend = backend
        self._h = header
        self._dev = device
        self._torch = torch
        self._zero = _serve.zero_copy()
        self._used = set()  # CUDA devices copied to: synced before unmapping
        self._original = original  # () -> the library's own handle, for methods not served here
        self._orig = None

    def __getattr__(self, name):
        # A method this class does not serve (one a newer safetensors
        # added): the library's own handle on the same file answers it,
        # counted as a fallback.
        if name.startswith("_") or self.__dict__.get("_original") is None:
            raise AttributeError(name)
        if self.__dict__.get("_orig") is None:
            _report.fallback("safetensors.safe_open", "method:" + name, self._path())
            with _serve.bypass():
                self._orig = self._original()
        return getattr(self._orig, name)

    def _library(self, reason):
        """The library's own handle on the same file (opened once), for
        what is not served here; reason is the fallback counted."""
        if self.__dict__.get("_original") is None:
            raise _closed()
        if self.__dict__.get("_orig") is None:
            _report.fallback("safetensors.safe_open", reason, self._path())
            with _serve.bypass():
                self._orig = self._original()
        return self._orig

    # safe_open's interface
    def keys(self):
        self._check_open()
        return self._h.keys()

    def offset_keys(self):
        self._check_open()
        return self._h.offset_keys()

    def metadata(self):
        self._check_open()
        return None if self._h.metadata is None else dict(self._h.metadata)

    def get_tensor(self, name):
        info = self._info(name)
        return self._materialize(info)

    def get_tensors(self):
        """Every tensor, in file order (safetensors 0.8's get_tensors)."""
        return {k: self.get_tensor(k) for k in self.offset_keys()}

    def get_slice(self, name):
        return _Slice(self, self._info(name))

    def _check_open(self):
        if self._lease is None:
            raise _closed()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        lease, self._lease = self.__dict__.get("_lease"), None
        orig, self._orig = self.__dict__.get("_orig"), None
        if orig is not None and hasattr(orig, "__exit__"):
            orig.__exit__(None, None, None)
        if lease is None:
            return
        try:
            _serve.sync(self._torch, self._used)
        finally:
            lease.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    # helpers
    def _info(self, name):
        self._check_open()
        try:
            return self._h.tensors[name]
        except KeyError:
            raise _missing(name) from None

    def _path(self):
        return self.__dict__.get("_pathname", "?")

    def _dtype(self, info):
        return getattr(self._torch, _stformat.DTYPES[info.dtype][0])

    def _view(self, info):
        """A zero-copy view of the tensor in the lease, or None when its
        offset is not aligned to the element size."""
        dt = self._dtype(info)
        if info.begin % _serve.element_size(self._torch, dt):
            return None
        return self._lease.tensor(dt, info.shape, info.begin)

    def _on_target(self):
        m = self._lease
        if self._dev.type == "cuda":
            return m.is_gpu and m.ordinal == self._dev.index
        return not m.is_gpu

    def _materialize(self, info):
        torch = self._torch
        dt = self._dtype(info)
        if info.nbytes == 0:
            return torch.zeros(info.shape, dtype=dt, device=self._dev)
        if self._zero and self._on_target():
            v = self._view(info)
            if v is not None:
                return v
        src = self._lease.tensor(torch.uint8, (info.nbytes,), info.begin)
        out = torch.empty(info.nbytes, dtype=torch.uint8, device=self._dev)
        out.copy_(src)
        if self._dev.type == "cuda":
            self._used.add(self._dev)
        return out.view(dt).view(info.shape)

    def _sliced(self, info, key):
        torch = self._torch
        if self._lease is None:
            # The library's slice outlives its handle (it holds the file's
            # storage); the lease does not: the library slices the file.
            return self._library_slice(info, key, "slice-after-close")
        if self._backend == "pread":
            # The library's own slicing: slices and integers, copied out
            # contiguous; anything else is left to it.
            parts = _pread_parts(info.shape, key)
            if parts is None:
                return self._library_slice(info, key, "slice:pread")
            t = self._materialize(info)
            dim = 0
            for k in parts:
                if isinstance(k, slice):
                    t = t.narrow(dim, k.start, k.stop - k.start)
                    dim += 1
                else:
                    t = t.select(dim, k)
            return t.clone(memory_format=torch.contiguous_format)
        if info.nbytes == 0 or self._dev.type == "cpu":
            # The library indexes a tensor of the full shape and returns
            # that view, strides of the full shape included: an empty one
            # on any device, and on the CPU every tensor (its mapping of
            # the file there). Compared on the GPU machine, safetensors
            # 0.8.0; on CUDA it returns the slice contiguous.
            return self._materialize(info)[key]
        full = self._view(info)
        if full is None:
            full = self._materialize(info)
            if self._zero and self._on_target():
                return full[key]
            return full[key].clone(memory_format=torch.contiguous_format)
        v = full[key]
        if self._zero and self._on_target():
            return v
        out = torch.empty(v.shape, dtype=v.dtype, device=self._dev)
        out.copy_(v)
        if self._dev.type == "cuda":
            self._used.add(self._dev)
        return out

    def _library_slice(self, info, key, reason):
        """key of the library's own slice of the tensor (counted as a
        fallback for reason the first time)."""
        lib = self.__dict__.get("_libslices")
        if lib is None:
            lib = self._libslices = {}
        if info.name not in lib:
            with _serve.bypass():
                lib[info.name] = self._library(reason).get_slice(info.name)
        with _serve.bypass():
            return lib[info.name][key]


def _pread_parts(shape, key):
    """key as the library's pread slicing reads it, one part per leading
    dimension (slice(start, stop) or an index), or None for a key whose
    outcome is left to the library (steps, negative bounds, empty ranges,
    anything but slices and integers)."""
    parts = list(key) if isinstance(key, tuple) else [key]
    if not parts or len(parts) > len(shape):
        return None
    out = []
    for k, size in zip(parts, shape):
        if isinstance(k, slice):
            start = 0 if k.start is None else k.start
            stop = size if k.stop is None else k.stop
            if k.step not in (None, 1) or type(start) is not int or type(stop) is not int or not 0 <= start < stop <= size:
                return None
            out.append(slice(start, stop))
        elif type(k) is int and -size <= k < size:
            out.append(k % size)
        else:
            return None
    return out


class _Slice:
    """What get_slice returns: shape and dtype now, tensors on indexing."""

    def __init__(self, served, info):
        self._s = served
        self._info = info

    def get_shape(self):
        return list(self._info.shape)

    def get_dtype(self):
        return self._info.dtype

    def __getitem__(self, key):
        return self._s._sliced(self._info, key)


def _missing(name):
    try:
        from safetensors import SafetensorError

        return SafetensorError("File does not contain tensor %s" % name)
    except Exception:
        return KeyError("File does not contain tensor %s" % name)


def open_served(loader, filename, device, original=None, backend="mmap"):
    """A Served for filename on device, or Fallback. original: opens the
    library's own handle (methods Served does not have go there)."""
    torch = _torch()
    if not isinstance(filename, (str, bytes, os.PathLike)):
        raise Fallback("not-a-path")
    path = _serve.path_of(filename)
    if path is None:
        raise Fallback("not-a-path")
    dev = _device(torch, device)
    if dev.type == "cpu" and _serve.cpu_policy() == "original" and _serve.mount_is_gpu(path):
        raise Fallback("cpu-target-gpu-staged")
    lease = _serve.acquire(path)
    try:
        if dev.type == "cpu" and lease.is_gpu and _serve.cpu_policy() == "original":
            raise Fallback("cpu-target-gpu-staged", _serve.socket_of(lease))
        try:
            header = _stformat.parse(lease.read, lease.size)
        except _stformat.FormatError as e:
            raise Fallback(e.reason, _serve.socket_of(lease), str(e)) from None
        for info in header.tensors.values():
            name = _stformat.DTYPES[info.dtype][0]
            if name is None or not hasattr(torch, name):
                raise Fallback("dtype:" + info.dtype, _serve.socket_of(lease))
    except BaseException:
        lease.close()
        raise
    return Served(lease, header, dev, torch, original, backend)


def _bind(sig, args, kwargs):
    """The call's arguments by name, or Fallback("arguments") saying which
    the patch does not know (the detail: a keyword this library version
    added, too many positional arguments)."""
    try:
        return sig.bind(*args, **kwargs).arguments
    except TypeError as e:
        raise Fallback("arguments", None, "%s (positional %d, keywords %s)" % (e, len(args), sorted(kwargs))) from None


def patch_safe_open(orig):
    """safetensors.safe_open served from a lease when it can be. backend
    (safetensors 0.8: how the library reads the file, "mmap" by default,
    what transformers 5 passes) does not change what is returned, so a
    served call ignores it."""
    try:
        sig = inspect.signature(lambda filename, framework, device="cpu", *, backend=None: None)
    except (TypeError, ValueError):  # pragma: no cover
        return orig

    @functools.wraps(orig, assigned=("__module__", "__name__", "__qualname__", "__doc__"), updated=())
    def safe_open(*args, **kwargs):
        if _serve.bypassed():
            return orig(*args, **kwargs)
        loader = "safetensors.safe_open"
        try:
            a = _bind(sig, args, kwargs)
            if a["framework"] not in _PT:
                raise Fallback("framework:%s" % (a["framework"],))
            backend = _backend(a.get("backend"))
            served = open_served(loader, a["filename"], a.get("device", "cpu"), lambda: orig(*args, **kwargs), backend)
        except Fallback as f:
            _report.fallback(loader, f.reason, _pathname(args, kwargs), f.socket, f.detail)
            with _serve.bypass():
                return orig(*args, **kwargs)
        _report.count_served(loader)
        return served

    safe_open._gdsfs_original = orig
    return safe_open


def patch_load_file(orig):
    """safetensors.torch.load_file served from a lease when it can be."""
    sig = inspect.signature(lambda filename, device="cpu": None)
    try:  # safetensors 0.8 added backend, keyword only (how it reads the file; nothing served changes)
        p = inspect.signature(orig).parameters.get("backend")
        if p is not None and p.kind == p.KEYWORD_ONLY:
            sig = inspect.signature(lambda filename, device="cpu", *, backend="mmap": None)
        elif p is not None:
            sig = inspect.signature(lambda filename, device="cpu", backend="mmap": None)
    except (TypeError, ValueError):
        pass
    # The order of the dict the library returns: safetensors 0.8's
    # load_file returns its handle's get_tensors() (the tensors in file
    # order), older ones walk keys() (sorted by name) or offset_keys().
    # Read off the original's code.
    names = getattr(getattr(orig, "__code__", None), "co_names", ())
    order = "offset_keys" if "offset_keys" in names or "get_tensors" in names else "keys"

    @functools.wraps(orig)
    def load_file(*args, **kwargs):
        if _serve.bypassed():
            return orig(*args, **kwargs)
        loader = "safetensors.torch.load_file"
        try:
            a = _bind(sig, args, kwargs)
            _backend(a.get("backend"))
            served = open_served(loader, a["filename"], a.get("device", "cpu"))
        except Fallback as f:
            _report.fallback(loader, f.reason, _pathname(args, kwargs), f.socket, f.detail)
            with _serve.bypass():
                return orig(*args, **kwargs)
        with served:
            out = {k: served.get_tensor(k) for k in getattr(served, order)()}
        _report.count_served(loader)
        return out

    load_file._gdsfs_original = orig
    return load_file


def _pathname(args, kwargs):
    f = args[0] if args else kwargs.get("filename")
    try:
        return str(f)
    except Exception:
        return "?"
