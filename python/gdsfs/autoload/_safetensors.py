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


def _device(torch, device):
    """The torch.device the library would put tensors on (it reads "cuda"
    as cuda:0 and an int as a CUDA ordinal), or Fallback."""
    if isinstance(device, bool):
        raise Fallback("device:%r" % (device,))
    if isinstance(device, int):
        return torch.device("cuda", device)
    try:
        d = torch.device(device)
    except (TypeError, ValueError, RuntimeError):
        raise Fallback("device:%s" % (device,)) from None
    if d.type == "cuda":
        return torch.device("cuda", d.index or 0)
    if d.type != "cpu":
        raise Fallback("device:%s" % d.type)
    return d


class Served:
    """One safetensors file leased and parsed: what safe_open returns."""

    def __init__(self, lease, header, device, torch, original=None):
        self._lease = lease
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

    # safe_open's interface
    def keys(self):
        return self._h.keys()

    def offset_keys(self):
        return self._h.offset_keys()

    def metadata(self):
        return None if self._h.metadata is None else dict(self._h.metadata)

    def get_tensor(self, name):
        info = self._info(name)
        return self._materialize(info)

    def get_tensors(self):
        """Every tensor, in file order (safetensors 0.8's get_tensors)."""
        return {k: self.get_tensor(k) for k in self.offset_keys()}

    def get_slice(self, name):
        return _Slice(self, self._info(name))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        orig, self._orig = self.__dict__.get("_orig"), None
        if orig is not None and hasattr(orig, "__exit__"):
            orig.__exit__(None, None, None)
        lease, self._lease = self.__dict__.get("_lease"), None
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
        if self._lease is None:
            raise RuntimeError("gdsfs: safe_open of %s is closed" % self._path())
        try:
            return self._h.tensors[name]
        except KeyError:
            raise _missing(name) from None

    def _path(self):
        return getattr(self._lease, "path", "?")

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


def open_served(loader, filename, device, original=None):
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
    return Served(lease, header, dev, torch, original)


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
            served = open_served(loader, a["filename"], a.get("device", "cpu"), lambda: orig(*args, **kwargs))
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
    try:  # safetensors 0.8 added backend (how it reads the file; nothing served changes)
        if "backend" in inspect.signature(orig).parameters:
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
