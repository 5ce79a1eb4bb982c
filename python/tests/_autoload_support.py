"""Helpers of the autoloader tests: torch required in CI, the stand-in
safetensors library, comparisons of tensors and of whole torch.load results."""

import hashlib
import json
import os
import sys
import unittest

from _support import TESTS, loud

FIXTURES = os.path.join(TESTS, "fixtures")
ST_FIXTURES = os.path.join(FIXTURES, "safetensors")
FAKE_ST = os.path.join(FIXTURES, "fake_safetensors")

# Lead: set True when committing the fixtures written by the safetensors
# library (scripts/make-safetensors-fixtures.py on the GPU machine); the
# tests then refuse fixtures of the minimal writer.
REQUIRE_LIBRARY_FIXTURES = True


def require_torch(tc):
    """torch is required: a failure in CI (CI=true), a loud skip elsewhere."""
    try:
        import torch  # noqa: F401
    except ImportError as e:
        msg = "the autoloader tests need torch (Debian's python3-torch; run them with /usr/bin/python3): %s" % e
        if os.environ.get("CI"):
            raise AssertionError(msg) from None
        raise unittest.SkipTest(loud("SKIPPED: " + msg)) from None


# GDSFS_REAL_SAFETENSORS=1 (the GPU tier): the installed safetensors
# library is required; the stand-in is never used, and a missing library
# fails the tests.
REAL_REQUIRED = os.environ.get("GDSFS_REAL_SAFETENSORS") == "1"


def safetensors_lib():
    """(module safetensors, whether it is the real library). The stand-in
    is used where the library is not installed, unless REAL_REQUIRED."""
    try:
        import safetensors  # noqa: F401

        real = "stand-in" not in getattr(sys.modules["safetensors"], "__version__", "")
        if REAL_REQUIRED and not real:
            raise AssertionError("GDSFS_REAL_SAFETENSORS=1 but safetensors is the stand-in (%s)" % sys.modules["safetensors"].__file__)
        return sys.modules["safetensors"], real
    except ImportError as e:
        if REAL_REQUIRED:
            raise AssertionError("GDSFS_REAL_SAFETENSORS=1 but the safetensors library is not installed: %s" % e) from None
    if FAKE_ST not in sys.path:
        sys.path.insert(0, FAKE_ST)
    import safetensors

    return safetensors, False


def known():
    with open(os.path.join(ST_FIXTURES, "known.json")) as f:
        return json.load(f)


def raw(t):
    t = t.detach().cpu().contiguous()
    if t.numel() == 0:
        return b""
    import torch

    return t.reshape(-1).view(torch.uint8).numpy().tobytes()


def sha(t):
    return hashlib.sha256(raw(t)).hexdigest()


def describe(t):
    return (str(t.dtype), tuple(t.shape), tuple(t.stride()), t.device.type, raw(t))


def tensors_in(obj, out=None):
    """The tensors of a nested result, in a fixed order."""
    import torch

    out = [] if out is None else out
    if isinstance(obj, torch.Tensor):
        out.append(obj)
    elif isinstance(obj, dict):
        for k in obj:
            tensors_in(obj[k], out)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            tensors_in(v, out)
    return out


def shape_of(obj):
    """The nested structure with tensors replaced by their description."""
    import torch

    if isinstance(obj, torch.Tensor):
        return ("tensor", describe(obj), obj.storage_offset(), obj.requires_grad)
    if isinstance(obj, dict):
        return (type(obj).__name__, [(k, shape_of(v)) for k, v in obj.items()])
    if isinstance(obj, (list, tuple)):
        return (type(obj).__name__, [shape_of(v) for v in obj])
    return ("value", repr(obj))


def sharing(obj):
    """Which tensors share a storage: index of the first tensor with it."""
    first, out = {}, []
    for t in tensors_in(obj):
        st = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()
        key = st.data_ptr() if t.numel() else ("empty", len(out))
        out.append(first.setdefault(key, len(out)))
    return out
