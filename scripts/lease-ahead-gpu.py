#!/usr/bin/env python3
"""Leases taken ahead, on and off, in one run: an unmodified DataLoader
epoch (num_workers=0) over N resident .npy shards read with
np.load(mmap_mode="r") and moved with .cuda(), in a new process per case
under the autoloader, the cases interleaved round by round:

- off: gdsfs.autoload._ahead.AHEAD = 0 (each shard's first move leases it);
- on: the default window (the worker leases the next shards);
- bound: the same loop with every shard put on the GPU before it (a
  device-to-device clone a shard): what serving the moves can approach.

Prints one JSON line per case and round (epoch seconds, the leases taken
by the moves and by the worker, the time inside them) and the medians;
exits 1 where the checksums differ or the worker leased nothing ahead in
an "on" round.
Needs a GPU, the binary (--bin) and python/ beside scripts/.

Usage: python3 scripts/lease-ahead-gpu.py --bin .bin/gdsfs [--work DIR] [--shards 64] [--mib 32] [--rounds 3]"""
import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from gpuscript import own_work_dir, start_mount  # noqa: E402

CHILD = r'''
import json, os, sys, threading, time
import numpy as np, torch
torch.cuda.init(); torch.empty(1, device="cuda"); torch.cuda.synchronize()
import gdsfs.autoload as A
from gdsfs.autoload import _ahead, _moves
from torch.utils.data import DataLoader, Dataset
d, case = sys.argv[1], sys.argv[2]
if case == "off":
    _ahead.AHEAD = 0
took = {}
orig = _moves._lease
def lease(e, ident, ahead=False, **kw):
    t = time.perf_counter()
    try:
        return orig(e, ident, ahead, **kw)
    finally:
        k = "worker" if ahead else "moves"
        n, s = took.get(k, (0, 0.0))
        took[k] = (n + 1, s + time.perf_counter() - t)
_moves._lease = lease
files = sorted(os.path.join(d, f) for f in os.listdir(d) if f.endswith(".npy"))
class Shards(Dataset):
    def __len__(self):
        return len(files)
    def __getitem__(self, i):
        return torch.from_numpy(np.load(files[i], mmap_mode="r"))
pre = [torch.from_numpy(np.load(f, mmap_mode="r")).cuda() for f in files] if case == "bound" else []
torch.cuda.synchronize()
took.clear()
total = torch.zeros((), dtype=torch.float64, device="cuda")
t0 = time.perf_counter()
for i, x in enumerate(DataLoader(Shards(), batch_size=None, shuffle=False, num_workers=0)):
    y = pre[i].clone() if pre else x.cuda()
    total += y.sum(dtype=torch.float64)
torch.cuda.synchronize()
el = time.perf_counter() - t0
print(json.dumps({"case": case, "seconds": el, "checksum": "%.6e" % total.item(),
                  "leases": {k: {"n": n, "ms": round(s * 1e3, 2)} for k, (n, s) in took.items()},
                  "served": A.served(), "fallbacks": A.fallbacks()}))
'''


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=os.path.join(HERE, "..", ".bin", "gdsfs"))
    ap.add_argument("--work", default="/var/tmp/gdsfs-lease-ahead")
    ap.add_argument("--shards", type=int, default=64)
    ap.add_argument("--mib", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    import numpy as np

    work = os.path.abspath(a.work)
    own_work_dir(work)
    src, mnt = os.path.join(work, "src"), os.path.join(work, "mnt")
    for d in (work, src, mnt):
        os.makedirs(d, exist_ok=True)
    names = ["s-%04d.npy" % i for i in range(a.shards)]
    for i, n in enumerate(names):
        p = os.path.join(src, n)
        if not os.path.exists(p) or os.path.getsize(p) < a.mib << 20:
            np.save(p, np.random.default_rng(i).standard_normal(a.mib << 18, dtype=np.float32))
    with open(os.path.join(work, "daemon.log"), "wb") as log:
        proc, up = start_mount(os.path.abspath(a.bin), ["ipc.socket=" + os.path.join(work, "lease.sock")], src, mnt, log)
        if not up:
            sys.exit("gdsfs mount did not come up; see %s/daemon.log" % work)
        try:
            subprocess.run([os.path.abspath(a.bin), "warmup", "--wait"] + [os.path.join(mnt, n) for n in names],
                           check=True, stdout=subprocess.DEVNULL)
            env = dict(os.environ, PYTHONPATH=os.path.join(HERE, "..", "python"))
            cases = ["off", "on", "bound"]
            runs = {c: [] for c in cases}
            sums = set()
            idle_worker = []  # rounds whose "on" case leased nothing ahead
            for r in range(a.rounds):
                for c in cases[r % 3:] + cases[:r % 3]:
                    p = subprocess.run([sys.executable, "-c", CHILD, mnt, c], env=env, capture_output=True, text=True)
                    if p.returncode != 0:
                        sys.exit("case %s failed:\n%s" % (c, p.stderr[-3000:]))
                    out = json.loads(p.stdout.strip().splitlines()[-1])
                    print(json.dumps(out), flush=True)
                    runs[c].append(out["seconds"])
                    sums.add(out["checksum"])
                    if c == "on" and not out["leases"].get("worker", {}).get("n"):
                        idle_worker.append(r)
        finally:
            proc.terminate()
            proc.wait(60)
    med = {c: statistics.median(v) for c, v in runs.items()}
    print(json.dumps({"median_seconds": med, "on_vs_off": med["off"] / med["on"], "on_vs_bound": med["on"] / med["bound"],
                      "checksums_agree": len(sums) == 1, "rounds_with_nothing_leased_ahead": idle_worker}))
    if idle_worker:
        print("FAIL: the worker leased nothing ahead in the \"on\" case of rounds %s" % idle_worker)
    return 0 if len(sums) == 1 and not idle_worker else 1


if __name__ == "__main__":
    sys.exit(main())
