#!/usr/bin/env python3
"""Where a small file's time goes when it is leased: per file, in one
process, over the files of DIR (a directory of a gdsfs mount, its files
resident, e.g. after `gdsfs warmup --wait DIR/`):

- first: a leased epoch (gdsfs.torch.leased, ahead 8), the process's
  first, with the time inside the daemon's answers (request), inside the
  client's mapping (map) and in each CUDA driver call of it, per file;
- repeat: gdsfs.open_many of files this process keeps mapped, in batches
  of 8 and 64; Lease.tensor; the consumer's sum (as the loader bench's);
- fresh: the same after gdsfs.disconnect() (the daemon has exported each
  file's memory before), with each CUDA driver call of the mapping.

Prints one JSON object (us per file). Runs on the host backend too (no
driver calls there).

Usage: python3 scripts/leased-parts-gpu.py DIR"""
import gc
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import torch  # noqa: E402

import gdsfs  # noqa: E402
import gdsfs.torch as gtorch  # noqa: E402
from gdsfs import _proto, _registry  # noqa: E402

T = time.perf_counter


def consume(t):
    """The loader bench's consumer: a sum of the file as int64 words."""
    return (t.view(torch.int64) if t.numel() % 8 == 0 else t).sum()


def main(d):
    paths = sorted(os.path.join(d, f) for f in os.listdir(d) if not f.startswith("."))
    paths = [p for p in paths if os.path.isfile(p)]
    if not paths:
        sys.exit("leased-parts-gpu.py: no files in %s" % d)
    gpu = torch.cuda.is_available()
    if gpu:
        torch.empty(1, device="cuda")
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    n = len(paths)
    per = lambda s: round(s / n * 1e6, 1)  # noqa: E731
    out = {"files": n, "gpu": gpu}
    spent = {}

    def timed(owner, name, label):
        f = getattr(owner, name)

        def w(*a, **k):
            t = T()
            try:
                return f(*a, **k)
            finally:
                spent[label] = spent.get(label, 0) + T() - t
        setattr(owner, name, w)
        return lambda: setattr(owner, name, f)

    drivers = ("MemImportFromShareableHandle", "MemAddressReserve", "MemMap", "MemSetAccess", "MemRelease")
    drv = None
    if gpu:
        from gdsfs import _cuda

        drv = _cuda.driver()

    def timing():
        u = [timed(_registry, "map_grant", "map"), timed(_proto.Conn, "request", "request")]
        if drv is not None:
            u += [timed(drv, name, name) for name in drivers]
        return u

    undo = timing()
    sync()
    t0 = T()
    sums = [consume(t) for t in gtorch.leased(paths, ahead=8)]
    sync()
    out["first_epoch"] = {"us": per(T() - t0), "parts": {k: per(v) for k, v in spent.items()}}
    del sums
    for u in undo:
        u()
    for b in (8, 64):
        t0 = T()
        ls = []
        for k in range(0, n, b):
            ls += gdsfs.open_many(paths[k:k + b])
        out["repeat_open_many_b%d" % b] = per(T() - t0)
        for x in ls:
            x.close()
    ls = gdsfs.open_many(paths[:64])
    t0 = T()
    ts = [x.tensor() for x in ls]
    out["lease_tensor"] = round((T() - t0) / len(ls) * 1e6, 1)
    sync()
    t0 = T()
    s = [consume(t) for t in ts]
    sync()
    out["consumer_sum"] = round((T() - t0) / len(ls) * 1e6, 1)
    del ts, s
    for x in ls:
        x.close()
    gdsfs.disconnect()
    gc.collect()
    spent.clear()
    undo = timing()
    t0 = T()
    ls = []
    for k in range(0, n, 8):
        ls += gdsfs.open_many(paths[k:k + 8])
    out["fresh_open_many_b8"] = {"us": per(T() - t0), "parts": {k: per(v) for k, v in spent.items()}}
    for u in undo:
        u()
    for x in ls:
        x.close()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
