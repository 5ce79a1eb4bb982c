# The Python side of `gdsfs bench lease`. Prints one JSON object, last.
#   bench_lease.py first WARM PATH...   a lease of WARM (libcuda, the context,
#       the connection come up), then the first lease of each PATH in this
#       process, to a usable pointer: {"first_ms": {path: ms}}. No torch.
#   bench_lease.py repeat RUNS PATH...  per PATH one untimed lease, then RUNS
#       repeat leases to a pointer and their close; with torch, RUNS
#       gdsfs.load to a tensor a kernel has read: {"repeat_ms": {path: [..]},
#       "close_ms": ..., "load_ms": ..., "fast_path": bool}.
# Uses only gdsfs.open / Lease.ptr / Lease.close / gdsfs.load, so it runs
# on any client version; open_many's presence says the client has the
# repeat-lease fast path.
import json
import sys
import time

import gdsfs


def timed_open(path):
    t0 = time.perf_counter()
    lease = gdsfs.open(path)
    if not lease.ptr:
        raise SystemExit("lease of %s has no pointer" % path)
    t1 = time.perf_counter()
    lease.close()
    return (t1 - t0) * 1e3, (time.perf_counter() - t1) * 1e3


def first(warm, paths):
    timed_open(warm)
    return {"first_ms": {p: timed_open(p)[0] for p in paths}}


def load_times(paths, runs):
    try:
        import torch
    except ImportError as e:
        return {}, "no torch: %s" % e
    with gdsfs.open(paths[0]) as lease:
        gpu = getattr(lease, "device", "host") != "host"
    if gpu:
        torch.empty(1, device="cuda")
        torch.cuda.synchronize()
    out = {}
    for p in paths:
        times = []
        for i in range(runs + 1):
            t0 = time.perf_counter()
            t = gdsfs.load(p)
            t[-1].item()  # a kernel (or the CPU) read it
            took = (time.perf_counter() - t0) * 1e3
            del t
            if i:
                times.append(took)
        out[p] = times
    return out, ""


def repeat(runs, paths):
    res = {"fast_path": hasattr(gdsfs, "open_many"), "repeat_ms": {}, "close_ms": {}}
    for p in paths:
        timed_open(p)
        samples = [timed_open(p) for _ in range(runs)]
        res["repeat_ms"][p] = [a for a, _ in samples]
        res["close_ms"][p] = [c for _, c in samples]
    res["load_ms"], res["load_unavailable"] = load_times(paths, runs)
    return res


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "first":
        out = first(sys.argv[2], sys.argv[3:])
    elif mode == "repeat":
        out = repeat(int(sys.argv[2]), sys.argv[3:])
    else:
        raise SystemExit("mode %r: want first or repeat" % mode)
    print(json.dumps(out))
