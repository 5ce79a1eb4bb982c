# A consumer of `gdsfs bench multigpu`. Usage:
#   multigpu.py one PATH             lease PATH on this process's device (the client's default)
#   multigpu.py both PATH DEV...     lease PATH on each DEV, in this one process
#   multigpu.py hold PATH            lease PATH on the default device, print the lease,
#                                    then "held", and keep it until stdin closes
# For each lease: the device asked, the device answered, whether the mapping
# is local (a GPU lease: the device answered is the one this process runs
# the mapping on, by UUID; host: the device answered is the one asked), and
# the SHA-256 of its bytes read back through the lease (not for hold).
# Prints one JSON object, last. torch is imported first where it is there
# and sees a GPU, so the default device is torch's current device.
import hashlib
import json
import sys

try:
    import torch

    if torch.cuda.is_available():
        torch.cuda.init()
    else:
        torch = None
except ImportError:
    torch = None

import gdsfs
from gdsfs import _device

STEP = 256 << 20


def uuid_of(ordinal):
    """The UUID of this process's CUDA device ordinal ("GPU-...")."""
    from gdsfs._cuda import device_uuid, driver

    return device_uuid(driver(), ordinal)


def lease_one(path, device, digest):
    asked = _device.resolve(device)
    lease = gdsfs.open(path, device=device)
    r = {"asked": asked, "device": lease.device, "size": lease.size, "generation": lease.generation}
    if lease.is_gpu:
        local = uuid_of(lease.ordinal)
        r["ordinal"] = lease.ordinal
        r["local_device"] = local
        r["local"] = local.lower() == lease.device.lower()
        if torch is not None:
            r["local"] = r["local"] and lease.tensor().device.index == lease.ordinal
    else:
        r["local"] = asked is not None and lease.device == asked
    if digest:
        h = hashlib.sha256()
        for off in range(0, lease.size, STEP):
            h.update(lease.read(off, STEP))
        r["sha256"] = h.hexdigest()
    return lease, r


def main():
    mode, path = sys.argv[1], sys.argv[2]
    if mode == "one":
        lease, r = lease_one(path, None, True)
        lease.close()
        print(json.dumps({"leases": [r]}))
    elif mode == "both":
        out = []
        for dev in sys.argv[3:]:
            lease, r = lease_one(path, dev, True)
            out.append(r)
            lease.close()
        print(json.dumps({"leases": out}))
    elif mode == "hold":
        lease, r = lease_one(path, None, False)
        print(json.dumps({"leases": [r]}), flush=True)
        print("held", flush=True)
        sys.stdin.read()
        lease.close()
    else:
        sys.exit("usage: multigpu.py one|both|hold PATH [DEV...]")


main()
