"""The device a lease asks for: the CUDA device the caller runs on.

A daemon that stages onto several GPUs (staging.placement: replica) leases
the replica on the device a request names, so the pointer a consumer gets
is on its own GPU. The client names, unless told otherwise:

1. GDSFS_DEVICE when set ("none" or empty: no device);
2. torch.cuda.current_device() as a UUID, when torch is imported and has
   initialised CUDA (that device's UUID, from the driver torch already
   loaded);
3. else the first entry of CUDA_VISIBLE_DEVICES: a UUID as it is, an index
   as an ordinal (the daemon's ordinals count the same devices: it sees
   them all); unset: ordinal 0, where an NVIDIA driver is installed;
4. else none (host-only machines: the daemon places the file).

Rule 3 never initialises CUDA: a process that forks workers may still
give them GPU leases.
"""

import os
import sys
import threading

_lock = threading.Lock()
_env_device = None  # rule 1 or 3, found once: (value,)
_uuids = {}  # torch ordinal -> "GPU-..."


def resolve(device):
    """The device field to send: device when given ("" or "none": none),
    else the default; None for none."""
    if device is None:
        return default_device()
    if device in ("", "none"):
        return None
    return str(device)


def default_device():
    """The device leases name when open() is not given one (see above)."""
    env = os.environ.get("GDSFS_DEVICE")
    if env is not None:
        env = env.strip()
        return None if env in ("", "none") else env
    d = _torch_device()
    if d is not None:
        return d
    global _env_device
    with _lock:
        if _env_device is None:
            _env_device = (_visible_device(),)
        return _env_device[0]


def forget():
    """Look again at the next lease (tests change the environment)."""
    global _env_device
    with _lock:
        _env_device = None
        _uuids.clear()


def _torch_device():
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        if not torch.cuda.is_initialized():
            return None
        i = torch.cuda.current_device()
    except Exception:
        return None
    with _lock:
        if i in _uuids:
            return _uuids[i]
    try:
        from ._cuda import driver, device_uuid

        u = device_uuid(driver(), i)
    except Exception:
        return str(i)
    with _lock:
        _uuids[i] = u
    return u


def _visible_device():
    v = os.environ.get("CUDA_VISIBLE_DEVICES")
    if v is not None:
        first = v.split(",")[0].strip()
        if first.startswith(("GPU-", "MIG-")) or first.isdigit():
            return first
        return None  # "" or "-1": no device visible
    if os.path.exists("/proc/driver/nvidia/gpus") or os.path.exists("/dev/nvidia0"):
        return "0"
    return None
