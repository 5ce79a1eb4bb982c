"""The safetensors format, parsed here (the library is not needed): an
8-byte little-endian header length N, N bytes of JSON, then the data. The
JSON maps each tensor name to {"dtype", "shape", "data_offsets": [begin,
end]} relative to the data, plus an optional "__metadata__" of strings."""

import json
import struct

# safetensors dtype -> (torch dtype name, bits per element). Names torch
# lacks (uint16 on torch 1.13, float8 before 2.1, ...) are not served.
DTYPES = {
    "BOOL": ("bool", 8), "U8": ("uint8", 8), "I8": ("int8", 8),
    "I16": ("int16", 16), "U16": ("uint16", 16), "F16": ("float16", 16), "BF16": ("bfloat16", 16),
    "I32": ("int32", 32), "U32": ("uint32", 32), "F32": ("float32", 32),
    "I64": ("int64", 64), "U64": ("uint64", 64), "F64": ("float64", 64), "C64": ("complex64", 64),
    "F8_E4M3": ("float8_e4m3fn", 8), "F8_E5M2": ("float8_e5m2", 8), "F8_E8M0": ("float8_e8m0fnu", 8),
    "F4": (None, 4), "F6_E2M3": (None, 6), "F6_E3M2": (None, 6),
}

MAX_HEADER = 100 << 20  # the library's own bound


class FormatError(ValueError):
    """Not a safetensors file this parser accepts: reason is a short token."""

    def __init__(self, reason, detail=""):
        super().__init__("%s: %s" % (reason, detail) if detail else reason)
        self.reason = reason


class Info:
    __slots__ = ("name", "dtype", "shape", "begin", "end")

    def __init__(self, name, dtype, shape, begin, end):
        self.name, self.dtype, self.shape, self.begin, self.end = name, dtype, shape, begin, end

    @property
    def nbytes(self):
        return self.end - self.begin


class Header:
    """tensors: {name: Info} with file offsets; metadata: dict or None."""

    def __init__(self, tensors, metadata, data_start):
        self.tensors = tensors
        self.metadata = metadata
        self.data_start = data_start

    def keys(self):
        return sorted(self.tensors)

    def offset_keys(self):
        return [i.name for i in sorted(self.tensors.values(), key=lambda i: (i.begin, i.end))]


def _numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def parse(read, size):
    """Parse the header of a size-byte file; read(offset, n) returns bytes."""
    if size < 8:
        raise FormatError("format:short", "%d bytes" % size)
    (n,) = struct.unpack("<Q", read(0, 8))
    if n > MAX_HEADER or n > size - 8:
        raise FormatError("format:header-size", "%d of %d bytes" % (n, size))
    raw = read(8, n)
    try:
        head = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise FormatError("format:header-json", str(e)) from None
    if not isinstance(head, dict):
        raise FormatError("format:header-json", "not an object")
    meta = head.pop("__metadata__", None)
    if meta is not None and not (isinstance(meta, dict) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in meta.items())):
        raise FormatError("format:metadata", "__metadata__ is not a map of strings")
    start = 8 + n
    tensors = {}
    for name, e in head.items():
        tensors[name] = _info(name, e, start)
    _check_cover(tensors, start, size)
    return Header(tensors, meta, start)


def _info(name, e, start):
    try:
        dt, shape, (b, en) = e["dtype"], e["shape"], e["data_offsets"]
        shape = tuple(shape)
        ok = all(type(d) is int and d >= 0 for d in shape) and type(b) is int and type(en) is int
    except (TypeError, KeyError, ValueError):
        raise FormatError("format:entry", name) from None
    if not ok or not 0 <= b <= en:
        raise FormatError("format:entry", name)
    if dt not in DTYPES:
        raise FormatError("format:dtype", "%s of %s" % (dt, name))
    bits = DTYPES[dt][1]
    if (_numel(shape) * bits + 7) // 8 != en - b or (_numel(shape) * bits) % 8:
        raise FormatError("format:entry-size", name)
    return Info(name, dt, shape, start + b, start + en)


def _check_cover(tensors, start, size):
    """The library refuses a file whose tensors leave holes, overlap, or do
    not end where the file does."""
    at = start
    for i in sorted(tensors.values(), key=lambda i: (i.begin, i.end)):
        if i.begin != at:
            raise FormatError("format:offsets", "hole or overlap before %s" % i.name)
        at = i.end
    if at != size:
        raise FormatError("format:offsets", "tensors end at %d, the file at %d" % (at, size))
