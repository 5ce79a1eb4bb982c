# The Python side of `gdsfs bench loader`. Usage: bench_loader.py JOB.json
# JOB: {"mnt", "src", "gpu", "epochs", "runs", "workers", "ahead",
#       "sets": {"shards": [rel...], "small": [rel...]}, "big": rel (optional)}
# Prints one JSON object, last: {"lease_helper", "epochs": {name: {...}}, "big": {...}}.
# Uses gdsfs.open/load/stat/disconnect, and gdsfs.torch.LeasedFiles where the
# client has it (feature-detected), so it runs on any client version.
import errno
import gc
import json
import os
import sys
import time
import warnings

import torch
from torch.utils.data import DataLoader, Dataset

import gdsfs

warnings.filterwarnings("ignore")
job = json.load(open(sys.argv[1]))
MNT, SRC, GPU = job["mnt"], job["src"], job["gpu"]
DEV = "cuda" if GPU else "cpu"

try:
    import gdsfs.torch as gtorch

    LeasedFiles = getattr(gtorch, "LeasedFiles", None)
except ImportError:
    LeasedFiles = None
HELPER = "gdsfs.torch.LeasedFiles (ahead=%d)" % job["ahead"] if LeasedFiles else "gdsfs.load per item"


T0 = time.perf_counter()


def say(fmt, *a):
    """Progress on stderr (the bench shows it as it comes)."""
    print("loader.py %6.1fs: %s" % (time.perf_counter() - T0, fmt % a), file=sys.stderr, flush=True)


def sync():
    if GPU:
        torch.cuda.synchronize()


def consume(t):
    """A kernel reads every byte: the sum of the file as int64 words."""
    return t.view(torch.int64).sum()


class LoadEach(Dataset):  # the fallback: one gdsfs.load per item
    def __init__(self, paths):
        self.paths = paths

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        return gdsfs.load(self.paths[i])


class ReadEach(Dataset):  # what an unmodified loader does: read() through the mount
    def __init__(self, paths):
        self.paths = paths

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        with open(self.paths[i], "rb") as f:
            return torch.frombuffer(bytearray(f.read()), dtype=torch.uint8)


def lease_loader(paths):
    if LeasedFiles is not None:
        return DataLoader(LeasedFiles(paths, ahead=job["ahead"]), batch_size=None, num_workers=0)
    return DataLoader(LoadEach(paths), batch_size=None, num_workers=0)


def read_loader(paths):
    w = job["workers"]
    more = {"persistent_workers": True, "prefetch_factor": 4} if w else {}
    return DataLoader(ReadEach(paths), batch_size=None, num_workers=w, **more)


def epoch(what, make, paths, nbytes, device_copy):
    loader = make(paths)
    rates, sums = [], None
    for e in range(job["epochs"]):
        say("%s, epoch %d of %d ...", what, e + 1, job["epochs"])
        out = []
        sync()
        t0 = time.perf_counter()
        for t in loader:
            if device_copy:
                t = t.to(DEV, non_blocking=False)
            out.append(consume(t))
            del t
        sync()
        rates.append(nbytes / (time.perf_counter() - t0) / 1e9)
        say("%s, epoch %d: %.2f GB/s", what, e + 1, rates[-1])
        sums = [int(s) for s in out]
        gc.collect()
    del loader
    return rates, sums


def file_set(name, rels):
    paths = [os.path.join(MNT, r) for r in rels]
    nbytes = sum(os.path.getsize(os.path.join(SRC, r)) for r in rels)
    res = {"files": len(rels), "bytes": nbytes}
    try:
        what = "%s (%d files)" % (name, len(rels))
        res["lease_gbps"], lsums = epoch(what + ", leases", lease_loader, paths, nbytes, False)
        res["read_gbps"], rsums = epoch(what + ", read()", read_loader, paths, nbytes, True)
        res["sums_match"] = lsums == rsums
    except Exception as e:
        res["error"] = "%s: %s" % (type(e).__name__, e)
    return res


def evict(rel, path):
    """Drop rel from the cache: nothing of it leased, then not resident."""
    gdsfs.disconnect()  # repeat-lease mappings this process keeps
    gc.collect()
    deadline = time.monotonic() + 30
    while True:
        try:
            with open(os.path.join(MNT, ".gdsfs", "evict"), "w") as f:
                f.write(rel + "\n")
        except OSError as e:
            if e.errno == errno.ENOENT:  # not in the cache
                return
            if e.errno not in (errno.EBUSY, errno.EAGAIN) or time.monotonic() > deadline:
                raise
        if gdsfs.stat(path).get("state") in ("absent", ""):
            return
        if time.monotonic() > deadline:
            raise RuntimeError("%s still %s after evicting" % (rel, gdsfs.stat(path).get("state")))
        time.sleep(0.05)


def warm(path):
    with open(path, "rb", buffering=0) as f:
        while f.read(64 << 20):
            pass


def big(rel):
    path, src = os.path.join(MNT, rel), os.path.join(SRC, rel)
    n = os.path.getsize(src)
    res = {"bytes": n, "load_gbps": [], "h2d_gbps": []}
    try:
        for r in range(job["runs"]):
            say("big %s, run %d of %d: evict, warm the page cache ...", rel, r + 1, job["runs"])
            evict(rel, path)
            warm(src)  # the page cache holds it; the cache does not
            say("big %s, run %d: gdsfs.load ...", rel, r + 1)
            sync()
            t0 = time.perf_counter()
            t = gdsfs.load(path)
            t[-1].item()
            res["load_gbps"].append(n / (time.perf_counter() - t0) / 1e9)
            del t
            gc.collect()
    except Exception as e:
        res["error"] = "%s: %s" % (type(e).__name__, e)
    if not GPU:
        res["h2d_unavailable"] = "n/a (host backend)"
        return res
    say("big: pinned host-to-device copy ...")
    step = min(n, 1 << 30)
    pinned = torch.empty(step, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(n, dtype=torch.uint8, device="cuda")
    for _ in range(job["runs"] + 1):
        sync()
        t0 = time.perf_counter()
        for off in range(0, n, step):
            k = min(step, n - off)
            dst[off:off + k].copy_(pinned[:k], non_blocking=True)
        sync()
        res["h2d_gbps"].append(n / (time.perf_counter() - t0) / 1e9)
    res["h2d_gbps"] = res["h2d_gbps"][1:]
    return res


def main():
    if GPU:
        torch.empty(1, device="cuda")
        sync()
    out = {"lease_helper": HELPER, "epochs": {}}
    for name, rels in job["sets"].items():
        if rels:
            out["epochs"][name] = file_set(name, rels)
    if job.get("big"):
        out["big"] = big(job["big"])
    print(json.dumps(out))


main()
