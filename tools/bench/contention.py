# One consumer of `gdsfs bench contention`. Usage: bench_contention.py JOB.json SEED [COUNT]
# JOB: {"mnt", "files": [{"rel", "size", "sha256"}...]}. Leases COUNT (default:
# all) of the files one at a time, in an order drawn from SEED, hashes each
# lease's bytes (read back through the lease) and compares with the file's
# SHA-256. Prints one JSON object, last. No torch: gdsfs.open and Lease.read.
import errno
import hashlib
import json
import os
import random
import sys
import time

import gdsfs

STEP = 32 << 20

job = json.load(open(sys.argv[1]))
files = list(job["files"])
random.Random(int(sys.argv[2])).shuffle(files)
if len(sys.argv) > 3:
    files = files[: int(sys.argv[3])]
out = {"acquired": 0, "failed": 0, "mismatches": 0, "errors": {}, "first_error": "", "acquire_s": []}
start = time.perf_counter()
for f in files:
    path = os.path.join(job["mnt"], f["rel"])
    t0 = time.perf_counter()
    try:
        lease = gdsfs.open(path)
    except OSError as e:
        out["failed"] += 1
        name = errno.errorcode.get(e.errno, str(e.errno))
        out["errors"][name] = out["errors"].get(name, 0) + 1
        out["first_error"] = out["first_error"] or "%s: %s" % (f["rel"], e)
        continue
    out["acquired"] += 1
    out["acquire_s"].append(time.perf_counter() - t0)
    try:
        h = hashlib.sha256()
        for off in range(0, f["size"], STEP):
            h.update(lease.read(off, min(STEP, f["size"] - off)))
        if h.hexdigest() != f["sha256"]:
            out["mismatches"] += 1
            out["first_error"] = out["first_error"] or "%s: sha256 %s, want %s" % (f["rel"], h.hexdigest(), f["sha256"])
    finally:
        lease.close()
out["seconds"] = time.perf_counter() - start
print(json.dumps(out))
