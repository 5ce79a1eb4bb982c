#!/usr/bin/env python3
"""Write the small safetensors fixtures of the autoloader's tests, and a
JSON of their known tensors (dtype, shape, sha256 of the bytes), with the
safetensors library itself. Run on the GPU machine (it has the library):

    python3 scripts/make-safetensors-fixtures.py --out python/tests/fixtures/safetensors

then commit python/tests/fixtures/safetensors/. `--writer minimal` writes
the same files without the library (what the tests used until the lead
committed the library's); unaligned.safetensors is always written by the
minimal writer, on purpose: the library pads headers, so only a hand-made
file has tensor offsets that are not multiples of their element size.
Tensors are deterministic (seeded), so a rerun writes the same known.json.
"""

import argparse
import hashlib
import json
import os
import struct
import sys

import torch

# Every safetensors dtype torch 1.13 has (the CI's torch), by its torch name.
BASE = ["bool", "uint8", "int8", "int16", "float16", "bfloat16", "int32", "float32", "float64", "int64"]
# Newer torch only: written when the generating torch has them; on torch
# 1.13 their file must fall back ("dtype:...").
NEWER = ["uint16", "uint32", "uint64", "float8_e4m3fn", "float8_e5m2"]
# Dtypes torch added later still (safetensors 0.8 has them): their own file,
# extra_dtypes.safetensors, with its own seed, so the files above stay as
# they were.
EXTRA = ["complex64", "float8_e8m0fnu"]
ST = {"complex64": "C64", "float8_e8m0fnu": "F8_E8M0", "bool": "BOOL", "uint8": "U8", "int8": "I8", "int16": "I16", "uint16": "U16", "float16": "F16",
      "bfloat16": "BF16", "int32": "I32", "uint32": "U32", "float32": "F32", "float64": "F64",
      "int64": "I64", "uint64": "U64", "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2"}


def raw(t):
    t = t.detach().cpu().contiguous()
    if t.numel() == 0:
        return b""
    return t.reshape(-1).view(torch.uint8).numpy().tobytes()


def make(name, shape, g):
    dt = getattr(torch, name)
    if name == "bool":
        return torch.randint(0, 2, shape, generator=g).to(torch.bool)
    if name == "float8_e8m0fnu":  # exponent only: powers of two
        return torch.randn(shape, generator=g, dtype=torch.float32).abs().add(1e-3).to(dt)
    if name == "complex64":
        return torch.randn(shape + (2,), generator=g, dtype=torch.float32).view(torch.complex64).reshape(shape)
    if name.startswith(("float", "bfloat")):
        return torch.randn(shape, generator=g, dtype=torch.float32).to(dt)
    if name.startswith("uint") and name != "uint8":
        # no randint for these on older torch: reinterpret int bytes
        n = 1
        for d in shape:
            n *= d
        size = torch.empty((), dtype=dt).element_size()
        b = torch.randint(0, 256, (n * size,), generator=g, dtype=torch.uint8)
        return b.view(dt).reshape(shape)
    lo, hi = (0, 256) if name == "uint8" else (-100, 100)
    return torch.randint(lo, hi, shape, generator=g).to(dt)


def sets():
    g = torch.Generator().manual_seed(1413)
    files = {}
    t = {}
    for i, name in enumerate(BASE):
        t["w_%s" % name] = make(name, (3 + i % 3, 5), g)
        t["v_%s" % name] = make(name, (7,), g)
    t["scalar_f64"] = make("float64", (), g)
    t["scalar_bool"] = make("bool", (), g)
    t["scalar_i32"] = make("int32", (), g)
    t["empty_f32"] = torch.empty((0, 4), dtype=torch.float32)
    t["empty_i64"] = torch.empty((2, 0, 3), dtype=torch.int64)
    t["big_f32"] = make("float32", (64, 96), g)
    t["layers.0.attn.q"] = make("bfloat16", (16, 32), g)
    files["all_dtypes.safetensors"] = (t, {"format": "pt", "source": "gdsfs autoload fixtures"})
    files["nometa.safetensors"] = ({"a": make("float32", (2, 3), g), "b": make("int64", (4,), g)}, None)
    files["empty.safetensors"] = ({}, {"note": "no tensors"})
    newer = {"x_%s" % n: make(n, (3, 4), g) for n in NEWER if hasattr(torch, n)}
    newer["plain_f32"] = make("float32", (2, 2), g)
    files["newer.safetensors"] = (newer, {"format": "pt"})
    g = torch.Generator().manual_seed(2908)
    extra = {"x_%s" % n: make(n, (3, 4), g) for n in EXTRA if hasattr(torch, n)}
    extra["plain_f32"] = make("float32", (2, 2), g)
    files["extra_dtypes.safetensors"] = (extra, {"format": "pt"})
    return files


def minimal_write(tensors, metadata, path, pad=True):
    """The format by hand: header JSON (names sorted), data in that order."""
    head, off, blobs = {}, 0, []
    for k in sorted(tensors):
        b = raw(tensors[k])
        head[k] = {"dtype": ST[str(tensors[k].dtype).split(".")[-1]], "shape": list(tensors[k].shape),
                   "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    if metadata is not None:
        head = dict({"__metadata__": metadata}, **head)
    h = json.dumps(head, separators=(",", ":")).encode()
    if pad:
        h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def known(tensors, metadata, writer):
    return {
        "writer": writer,
        "metadata": metadata,
        "tensors": {k: {"dtype": ST[str(v.dtype).split(".")[-1]], "shape": list(v.shape),
                        "sha256": hashlib.sha256(raw(v)).hexdigest()} for k, v in sorted(tensors.items())},
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "python", "tests",
                                                  "fixtures", "safetensors"))
    ap.add_argument("--writer", choices=("library", "minimal"), default="library")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    if a.writer == "library":
        import safetensors
        from safetensors.torch import save_file

        writer = "safetensors %s" % safetensors.__version__
    else:
        writer = "gdsfs minimal writer"
    out = {"torch": torch.__version__, "files": {}}
    for name, (tensors, meta) in sets().items():
        p = os.path.join(a.out, name)
        if a.writer == "library":
            save_file(tensors, p, metadata=meta)
        else:
            minimal_write(tensors, meta, p)
        out["files"][name] = known(tensors, meta, writer)
    g = torch.Generator().manual_seed(7)
    un = {"a_u8": make("uint8", (3,), g), "b_f32": make("float32", (2, 3), g), "c_f64": make("float64", (5,), g),
          "d_i16": make("int16", (3,), g)}
    minimal_write(un, {"why": "offsets not multiples of the element size"}, os.path.join(a.out, "unaligned.safetensors"),
                  pad=False)
    out["files"]["unaligned.safetensors"] = known(un, {"why": "offsets not multiples of the element size"},
                                                  "gdsfs minimal writer (unaligned on purpose)")
    with open(os.path.join(a.out, "known.json"), "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)
        f.write("\n")
    print("wrote %d files and known.json to %s (%s)" % (len(out["files"]), a.out, writer))


if __name__ == "__main__":
    sys.exit(main())
