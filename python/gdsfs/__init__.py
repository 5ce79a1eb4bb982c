"""gdsfs consumer client: lease files staged by a gdsfs mount and use the
staged bytes in place (GPU memory via CUDA VMM import, or host memfds).

    import gdsfs
    with gdsfs.open("/mnt/gdsfs/model.bin") as lease:
        t = lease.tensor(torch.float16, (1024, 1024))   # zero-copy
    t = gdsfs.load("/mnt/gdsfs/shard-0001.bin")          # lease lives with t

Pure Python over ctypes; importing gdsfs imports neither torch nor cupy.
See python/README.md.
"""

from ._lease import Lease, disconnect, load, open, stat
from ._mount import locate
from ._proto import NotMountedError

__all__ = ["Lease", "NotMountedError", "disconnect", "load", "locate", "open", "stat"]
__version__ = "0.1.0"
