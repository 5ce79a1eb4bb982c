#!/usr/bin/env python3
"""Load a safetensors checkpoint through a gdsfs lease, zero-copy.

    python3 examples/safetensors_load.py MOUNT/model.safetensors

One lease maps the whole file. The safetensors header is parsed here (an
8-byte little-endian header length, then a JSON object of
{name: {"dtype", "shape", "data_offsets": [begin, end]}} with offsets from
the end of the header), and every tensor is a view of the staged bytes at
its offset: lease.tensor(dtype, shape, offset). On a GPU-staged mount the
tensors live on the GPU that holds the file, without any copy; on the host
backend they are read-only CPU tensors over the daemon's memory. They keep
the lease alive for as long as any of them exists.

For each tensor one line is printed: name, dtype, shape, sha256 of its
bytes, where it lives. Without torch (or with --no-torch) the checksums
come straight from the lease's memoryview (host backend) or a
device-to-host copy (GPU). With torch and the safetensors package, the
result is compared with safetensors.torch.load_file (--no-compare skips).

Requirements: Python >= 3.8; torch optional; safetensors optional. The
file must be under a gdsfs mount (--socket / GDSFS_SOCKET pick its socket).
Exit status: 0 when everything agrees, 1 on a mismatch, 2 on bad input.
"""

import argparse
import hashlib
import json
import os
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

import gdsfs  # noqa: E402

# safetensors dtype -> (torch attribute name, bytes per element)
DTYPES = {
    "BOOL": ("bool", 1),
    "U8": ("uint8", 1),
    "I8": ("int8", 1),
    "F8_E4M3": ("float8_e4m3fn", 1),
    "F8_E5M2": ("float8_e5m2", 1),
    "I16": ("int16", 2),
    "U16": ("uint16", 2),
    "F16": ("float16", 2),
    "BF16": ("bfloat16", 2),
    "I32": ("int32", 4),
    "U32": ("uint32", 4),
    "F32": ("float32", 4),
    "I64": ("int64", 8),
    "U64": ("uint64", 8),
    "F64": ("float64", 8),
}


class Entry:
    __slots__ = ("name", "dtype", "shape", "offset", "nbytes")

    def __init__(self, name, dtype, shape, offset, nbytes):
        self.name, self.dtype, self.shape, self.offset, self.nbytes = name, dtype, shape, offset, nbytes


def parse_header(lease):
    """The tensors of a safetensors file, from the leased bytes; offsets
    are absolute (from the start of the file)."""
    if lease.size < 8:
        raise ValueError("%s: %d bytes, too short for a safetensors file" % (lease.path, lease.size))
    (n,) = struct.unpack("<Q", lease.read(0, 8))
    if n > lease.size - 8 or n > 100 << 20:
        raise ValueError("%s: header length %d does not fit the %d-byte file" % (lease.path, n, lease.size))
    header = json.loads(lease.read(8, n).decode("utf-8"))
    if not isinstance(header, dict):
        raise ValueError("%s: header is not a JSON object" % lease.path)
    base = 8 + n
    out = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = info["dtype"]
        if dtype not in DTYPES:
            raise ValueError("%s: tensor %s has unknown dtype %s" % (lease.path, name, dtype))
        shape = tuple(int(d) for d in info["shape"])
        begin, end = (int(x) for x in info["data_offsets"])
        count = 1
        for d in shape:
            count *= d
        if end - begin != count * DTYPES[dtype][1] or begin < 0 or base + end > lease.size:
            raise ValueError("%s: tensor %s: data_offsets %s do not match %s %s" % (lease.path, name, [begin, end], dtype, list(shape)))
        out.append(Entry(name, dtype, shape, base + begin, end - begin))
    out.sort(key=lambda e: e.offset)
    return out


def tensors_from(lease, entries):
    """{name: tensor} as views of the lease's bytes, and how each was made.
    A tensor whose offset is not aligned for its dtype (the format does not
    promise alignment) is copied; a dtype this torch lacks stays raw bytes."""
    import torch

    tensors, notes = {}, {}
    for e in entries:
        tname, size = DTYPES[e.dtype]
        dt = getattr(torch, tname, None)
        if dt is None:
            tensors[e.name] = lease.tensor(torch.uint8, (e.nbytes,), e.offset)
            notes[e.name] = "raw bytes (torch has no %s)" % tname
        elif e.offset % size:
            raw = lease.tensor(torch.uint8, (e.nbytes,), e.offset)
            tensors[e.name] = raw.clone().view(dt).view(e.shape)
            notes[e.name] = "copied (offset %d not %d-aligned)" % (e.offset, size)
        else:
            tensors[e.name] = lease.tensor(dt, e.shape, e.offset)
            notes[e.name] = "zero-copy"
    return tensors, notes


def load_safetensors(path, socket=None):
    """{name: tensor} of a safetensors file under a gdsfs mount, zero-copy
    where possible. The lease is released when the tensors are gone."""
    with gdsfs.open(path, socket=socket) as lease:  # close waits for the tensors
        tensors, _ = tensors_from(lease, parse_header(lease))
    return tensors


def checksums(lease, entries):
    """sha256 of each tensor's bytes: from the memoryview on host (no copy),
    a device-to-host copy on a GPU."""
    out = {}
    if lease.is_gpu:
        for e in entries:
            out[e.name] = hashlib.sha256(lease.read(e.offset, e.nbytes)).hexdigest()
    else:
        mv = lease.memoryview()
        for e in entries:
            out[e.name] = hashlib.sha256(mv[e.offset : e.offset + e.nbytes]).hexdigest()
        del mv
    return out


def tensor_sha256(torch, t):
    u = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
    try:
        b = u.numpy().tobytes()
    except (ImportError, RuntimeError):  # torch without numpy
        b = bytes(u.tolist())
    return hashlib.sha256(b).hexdigest()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("file", help="a .safetensors file under a gdsfs mount")
    ap.add_argument("--socket", help="lease socket (default: GDSFS_SOCKET or MOUNT/.gdsfs/socket)")
    ap.add_argument("--no-torch", action="store_true", help="do not use torch even if it is installed")
    ap.add_argument("--no-compare", action="store_true", help="skip the safetensors.torch.load_file comparison")
    ap.add_argument("--verify", action="store_true",
                    help="also hash each tensor's bytes (copied to the CPU) and check them against the file's")
    args = ap.parse_args(argv)

    torch = None
    if not args.no_torch:
        try:
            import torch
        except ImportError:
            print("torch not installed: checksums only", file=sys.stderr)

    with gdsfs.open(args.file, socket=args.socket) as lease:
        try:
            entries = parse_header(lease)
        except (ValueError, KeyError, TypeError) as e:
            print("error: %s" % e, file=sys.stderr)
            return 2
        print("# %s: %d bytes, %d tensors, staged on %s (generation %s, %s)" % (
            args.file, lease.size, len(entries), lease.device, lease.generation, lease.sharing or "-"))
        sums = checksums(lease, entries)
        if torch is not None:
            tensors, notes = tensors_from(lease, entries)
    # The lease is closed: without torch it is released now; with torch the
    # tensors hold it until they are gone.

    for e in entries:
        if torch is None:
            where = "gpu (read back)" if lease.is_gpu else "host memoryview"
        else:
            t = tensors[e.name]
            where = "%s %s %s" % (t.device, str(t.dtype).replace("torch.", ""), notes[e.name])
        print("%s\t%s\t%s\tsha256=%s\t%s" % (e.name, e.dtype, list(e.shape), sums[e.name], where))
    print("%d tensors, %d bytes" % (len(entries), sum(e.nbytes for e in entries)))
    if torch is None:
        return 0
    if args.verify:
        bad = [e.name for e in entries if tensor_sha256(torch, tensors[e.name]) != sums[e.name]]
        if bad:
            print("MISMATCH between tensors and file bytes: %s" % ", ".join(bad))
            return 1
        print("verified: every tensor holds its bytes of the file")

    if args.no_compare:
        return 0
    try:
        from safetensors.torch import load_file
    except ImportError:
        print("safetensors not installed: no comparison with safetensors.torch.load_file")
        return 0
    ref = load_file(args.file)
    bad = []
    for name, r in ref.items():
        ours = tensors.get(name)
        if ours is None or ours.shape != r.shape:
            bad.append(name)
            continue
        a = ours.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
        b = r.contiguous().reshape(-1).view(torch.uint8)
        if not torch.equal(a, b):
            bad.append(name)
    if set(ref) != set(tensors):
        bad += sorted(set(ref) ^ set(tensors))
    if bad:
        print("MISMATCH with safetensors.torch.load_file: %s" % ", ".join(bad))
        return 1
    print("safetensors.torch.load_file agrees on all %d tensors" % len(ref))
    return 0


if __name__ == "__main__":
    sys.exit(main())
