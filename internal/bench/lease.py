# `gdsfs bench lease`: time from gdsfs.open() to a usable torch tensor for a
# resident file. Usage: bench_lease.py PATH RUNS. Prints JSON.
import json
import sys
import time

import torch

import gdsfs

path, runs = sys.argv[1], int(sys.argv[2])
torch.empty(1, device="cuda")
with gdsfs.open(path) as lease:  # warm-up: imports, libcuda, first mapping
    lease.tensor()
    torch.cuda.synchronize()
times = []
for _ in range(runs):
    start = time.perf_counter()
    lease = gdsfs.open(path)
    t = lease.tensor()
    t[0].item()  # usable: a kernel reads it
    times.append(time.perf_counter() - start)
    del t
    lease.close()
times.sort()
print(json.dumps({"min_ms": times[0] * 1e3, "median_ms": times[len(times) // 2] * 1e3}))
