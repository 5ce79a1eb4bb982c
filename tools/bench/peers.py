# The Python peers of `gdsfs bench stage --peers`: the usual ways a PyTorch
# program moves a file into GPU memory. Usage: bench_peers.py PATH warm|cold RUNS
# Prints one JSON object: peer name -> {"gbps": best} or {"error": "..."}.
import json
import os
import sys
import time
import warnings

warnings.filterwarnings("ignore")
path, mode, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
import torch  # noqa: E402

n = os.path.getsize(path)
torch.empty(1, device="cuda")  # the CUDA context is not part of any timing


def prepare():
    if mode == "cold":
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3")
    else:
        with open(path, "rb", buffering=0) as f:
            while f.read(1 << 24):
                pass


def naive():
    with open(path, "rb") as f:
        data = f.read()
    t = torch.frombuffer(data, dtype=torch.uint8).cuda()
    torch.cuda.synchronize()
    return t


def from_file():
    t = torch.from_file(path, shared=False, size=n, dtype=torch.uint8).cuda()
    torch.cuda.synchronize()
    return t


pinned = None


def pinned_readinto():
    with open(path, "rb", buffering=0) as f:
        f.readinto(memoryview(pinned.numpy()))
    t = pinned.cuda(non_blocking=True)
    torch.cuda.synchronize()
    return t


def gds():
    from torch.cuda import gds as tgds

    t = torch.empty(n, dtype=torch.uint8, device="cuda")
    f = tgds.GdsFile(path, os.O_RDONLY)
    f.load_storage(t.untyped_storage(), 0)
    torch.cuda.synchronize()
    return t


peers = {
    "python read + .cuda()": naive,
    "torch.from_file + .cuda()": from_file,
    "pinned readinto + .cuda()": pinned_readinto,
    "torch.cuda.gds GdsFile": gds,
}
out = {}
for name, fn in peers.items():
    try:
        if fn is pinned_readinto and pinned is None:
            pinned = torch.empty(n, dtype=torch.uint8, pin_memory=True)  # made once, untimed
        if mode == "warm":
            prepare()
            del_t = fn()  # warm-up, untimed
            del del_t
        best = 0.0
        for _ in range(runs):
            prepare()
            start = time.perf_counter()
            t = fn()
            took = time.perf_counter() - start
            del t
            best = max(best, n / took / 1e9)
            torch.cuda.empty_cache()
        out[name] = {"gbps": best}
    except Exception as e:  # a peer that cannot run here is reported, not fatal
        out[name] = {"error": "%s: %s" % (type(e).__name__, str(e).splitlines()[0] if str(e) else "")}
    torch.cuda.empty_cache()
pinned = None
print(json.dumps(out))
