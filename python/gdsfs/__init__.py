"""gdsfs consumer client: lease files staged by a gdsfs mount and use the
staged bytes in place (GPU memory via CUDA VMM import, or host memfds).

    import gdsfs
    with gdsfs.open("/mnt/gdsfs/model.bin") as lease:
        t = lease.tensor(torch.float16, (1024, 1024))   # zero-copy
    t = gdsfs.load("/mnt/gdsfs/shard-0001.bin")          # lease lives with t
    leases = gdsfs.open_many(paths)                      # one round trip
    gdsfs.wait("/mnt/gdsfs/shard-0002.bin", timeout=60)  # until resident or failed

    import gdsfs.torch                                   # leases ahead of a loop
    for t in gdsfs.torch.leased(paths, torch.float16): ...

Pure Python over ctypes; importing gdsfs imports neither torch nor cupy
(gdsfs.torch does import torch). See python/README.md and the protocol,
proto/PROTOCOL.md.
"""

from ._lease import Lease, disconnect, load, open, stat
from ._many import open_many
from ._mount import locate
from ._proto import NotMountedError, UntrustedDaemonError, untrusted
from ._version import RELEASE as __version__
from ._version import VersionMismatchError, VersionWarning, check_daemon
from ._wait import wait, wait_stat

__all__ = ["Lease", "NotMountedError", "UntrustedDaemonError", "VersionMismatchError", "VersionWarning", "check_daemon",
           "disconnect", "load", "locate", "open", "open_many", "stat", "untrusted", "wait", "wait_stat"]
