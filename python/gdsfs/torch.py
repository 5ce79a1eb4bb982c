"""gdsfs.torch: files under a gdsfs mount as zero-copy torch tensors,
leased ahead of the iteration so a loop (or a DataLoader) over shards runs
at the device's pace instead of the lease round trip's.

    import gdsfs.torch
    for t in gdsfs.torch.leased(shard_paths, torch.float16, ahead=16):
        model(t)                       # t is the staged bytes, on the GPU

    ds = gdsfs.torch.LeasedFiles(shard_paths, torch.float16, shuffle=True)
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=0)

A background thread leases the next files in batches (gdsfs.open_many: one
round trip per batch; files this process keeps mapped from an earlier
epoch are leased again without descriptors). Each tensor keeps its lease
until it is garbage-collected. Works on GPU leases and on the host backend
(CPU tensors over read-only memory: copy before writing; see
Lease.tensor).

Use num_workers=0 with GPU leases: leasing is already asynchronous, and a
CUDA mapping made in a forked DataLoader worker is not usable by the
parent. On the host backend workers may lease (each worker its share).
"""

import queue
import random
import threading

import torch

from ._many import open_many

__all__ = ["LeasedFiles", "leased"]

_END = object()


class _Failure:
    def __init__(self, exc):
        self.exc = exc


def leased(paths, dtype=None, shape=None, *, ahead=8, batch=None, transform=None, socket=None, timeout=None):
    """Yield a zero-copy tensor for each path in order (lease.tensor(dtype,
    shape)), or transform(lease) when given. Files are leased `batch`
    (default: ahead) per round trip, the next batch while the caller works
    through the previous: at most ahead + batch files are leased and not
    yet yielded. Stopping early (break, close) ends the leases not yet
    yielded."""
    paths = list(paths)
    ahead = max(1, int(ahead))
    batch = max(1, int(batch or ahead))
    # Batches, not leases, go through the queue (one hand-over between the
    # threads per round trip). `out` counts the files leased and not yet
    # handed to the caller; the producer takes room for a whole batch at
    # once and the consumer wakes it once per batch (when a batch fits
    # again), not once per file: each wake-up costs the consumer the GIL.
    limit = ahead + batch
    cv = threading.Condition()
    out = [0]
    q = queue.Queue()
    stop = threading.Event()

    def produce():
        try:
            for k in range(0, len(paths), batch):
                part = paths[k:k + batch]
                with cv:
                    while out[0] + len(part) > limit and not stop.is_set():
                        cv.wait()
                    if stop.is_set():
                        return
                    out[0] += len(part)
                q.put(open_many(part, socket=socket, timeout=timeout))
        except BaseException as e:  # handed to the consumer
            q.put(_Failure(e))
            return
        q.put(_END)

    def handed():
        with cv:
            out[0] -= 1
            if out[0] == limit - batch:
                cv.notify()

    th = threading.Thread(target=produce, name="gdsfs-lease-ahead", daemon=True)
    th.start()
    pending = []
    try:
        while True:
            item = q.get()
            if item is _END:
                return
            if isinstance(item, _Failure):
                raise item.exc
            pending = item
            while pending:
                lease = pending.pop(0)
                handed()
                try:
                    value = transform(lease) if transform is not None else lease.tensor(dtype, shape)
                finally:
                    lease.close()  # takes effect when the tensor (every view) is gone
                yield value
    finally:
        with cv:
            stop.set()
            cv.notify()
        _close(pending)
        while th.is_alive() or not q.empty():
            try:
                item = q.get(timeout=0.1)
            except queue.Empty:
                continue
            if isinstance(item, list):
                _close(item)
        th.join()


def _close(leases):
    for lease in leases:
        try:
            lease.close()
        except Exception:
            pass


class LeasedFiles(torch.utils.data.IterableDataset):
    """An IterableDataset of the files' tensors (see leased()), in order or
    shuffled per epoch (seed + epoch; call set_epoch). In DataLoader
    workers each worker takes every num_workers-th file."""

    def __init__(self, paths, dtype=None, shape=None, *, ahead=8, batch=None, shuffle=False, seed=0,
                 transform=None, socket=None, timeout=None):
        super().__init__()
        self.paths = list(paths)
        self.dtype, self.shape, self.transform = dtype, shape, transform
        self.ahead, self.batch = ahead, batch
        self.shuffle, self.seed, self.epoch = shuffle, seed, 0
        self.socket, self.timeout = socket, timeout

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __len__(self):
        return len(self.paths)

    def __iter__(self):
        order = list(range(len(self.paths)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        info = torch.utils.data.get_worker_info()
        if info is not None:
            order = order[info.id::info.num_workers]
        return leased([self.paths[i] for i in order], self.dtype, self.shape, ahead=self.ahead, batch=self.batch,
                      transform=self.transform, socket=self.socket, timeout=self.timeout)
