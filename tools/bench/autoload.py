"""gdsfs bench autoload-overhead: what the autoloader adds to a move of a
CPU tensor that is not a mapping of a gdsfs file.

Each call is timed plain (the original torch method) and through the
autoloader's wrapper, in the same process, in interleaved rounds: the
least time per call of each is kept, and the difference is what the
wrapper adds. The index holds a mapping of a gdsfs file (one of this
script's own, on the mount given; the Go side checks it was indexed), so that the calls take the path they
take inside a process that loaded a model from the mount. Prints one
JSON line."""

import argparse
import json
import os
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--src", required=True, help="the mount's SOURCE directory")
    ap.add_argument("--mnt", required=True, help="the mount point")
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=15)
    a = ap.parse_args()
    import numpy as np
    import torch

    import gdsfs.autoload
    from gdsfs.autoload import _maps

    gdsfs.autoload.enable()
    T = torch.Tensor
    if not hasattr(T.to, "_gdsfs_original"):
        raise SystemExit("the autoloader did not wrap Tensor.to")
    plain = {n: getattr(T, n)._gdsfs_original for n in ("to", "cuda", "copy_")}
    np.save(os.path.join(a.src, "mapped.npy"), np.arange(1 << 16, dtype=np.float32))
    keep = np.load(os.path.join(a.mnt, "mapped.npy"), mmap_mode="r")  # noqa: F841 (its mapping stays indexed)
    rebuilds = _maps.refreshes
    x = torch.arange(1000, dtype=torch.float32)
    d = torch.empty(1000, dtype=torch.float64)
    calls = {
        "x.to(torch.float64)": (lambda: plain["to"](x, torch.float64), lambda: x.to(torch.float64)),
        "x.to('cpu')": (lambda: plain["to"](x, "cpu"), lambda: x.to("cpu")),
        "cpu_dst.copy_(x)": (lambda: plain["copy_"](d, x), lambda: d.copy_(x)),
    }
    gpu = torch.cuda.is_available()
    if gpu:
        g = torch.empty(1000, dtype=torch.float32, device="cuda")
        calls["x.to('cuda')"] = (lambda: plain["to"](x, "cuda"), lambda: x.to("cuda"))
        calls["x.cuda()"] = (lambda: plain["cuda"](x), lambda: x.cuda())
        calls["cuda_dst.copy_(x)"] = (lambda: plain["copy_"](g, x), lambda: g.copy_(x))

    def per_call(f):
        t0 = time.perf_counter()
        for _ in range(a.calls):
            f()
        if gpu:
            torch.cuda.synchronize()
        return (time.perf_counter() - t0) / a.calls * 1e9

    out = {"calls": {}, "gpu": torch.cuda.get_device_name() if gpu else None, "torch": torch.__version__,
           "python": sys.version.split()[0], "calls_per_round": a.calls, "rounds": a.rounds}
    for name, (p, w) in calls.items():
        p(), w()
        ps, ws = [], []
        for i in range(a.rounds):
            for f, acc in ((p, ps), (w, ws)) if i % 2 == 0 else ((w, ws), (p, ps)):
                acc.append(per_call(f))
        out["calls"][name] = {"plain_ns": round(min(ps)), "wrapped_ns": round(min(ws)),
                              "added_ns": round(min(ws) - min(ps))}
    out["index_entries"] = len(_maps.entries())
    out["index_rebuilds"] = _maps.refreshes - rebuilds
    out["served"] = gdsfs.autoload.served()
    out["fallbacks"] = gdsfs.autoload.fallbacks()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
