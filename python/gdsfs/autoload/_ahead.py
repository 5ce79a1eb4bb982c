"""Leases taken ahead of the moves that will ask for them.

A loop that maps the files of a directory one after the other in the
order of their names (a DataLoader over shards, a loader walking a
checkpoint's shards) would pay a first lease on the first move out of
each file: the daemon's answer and mapping the file's memory, most of a
served move's time. When a hooked call maps a file right after the file
before it in its directory (names sorted as strings), one background
thread leases that file, the one before it and the next AHEAD files
there with the same extension, and _moves keeps them as it keeps the
leases moves took: the loop's next moves find them leased.

Only files already resident are leased ahead (a lease of any other would
stage it; whether to stage a file the loop has not opened is the daemon's
read-ahead's call), only in a process whose CUDA is initialized (leasing
initializes the driver, which a process that forks CUDA users must not
have done), and nothing at the cost of a lease a move took: a lease ahead
that the daemon refuses or grants short of room is given up, and counts
as no fallback (no move asked for it); a move refused for room gives
back the leases ahead no move used before any other (_moves._take).
stop() (disable(), the process's exit, a move short of room) drops the
queued work and waits for the lease in progress."""

import bisect
import os
import threading

from . import _report
from ._queue import QueueThread

AHEAD = 4  # files leased ahead of the last one mapped (0: none)
MAX_DIRS = 256  # directory listings remembered

_lock = threading.Lock()
_busy = threading.Lock()  # held by the worker while it looks at a job
_jobs = QueueThread("gdsfs-lease-ahead", lambda batch: _run(batch), batch=True)  # (epoch, path, CUDA ordinal or None)
_epoch = 0  # stop() moves it on: jobs queued before it are dropped
_on = True  # off between disable() and enable()
_last = {}  # directory -> the name last mapped there
_listings = {}  # directory -> (st_mtime_ns, st_ctime_ns, sorted names)


def seen(path, device):
    """A hooked call mapped path (the absolute path of a file on a gdsfs
    mount). device: the CUDA ordinal current in the calling thread (the
    leases ahead go there), or None. Costs the caller a queue put."""
    if AHEAD <= 0 or not _on:
        return
    with _lock:
        _jobs.put((_epoch, path, device))  # raises where no thread can be had: then there is none, nor a queue


def turn(on):
    """Off (the autoloader's disable()): nothing queued is leased, nor
    anything mapped until turned on again (enable())."""
    global _on
    _on = on
    if not on:
        stop()


def stop():
    """Drop the jobs queued so far and wait for the one being looked at:
    no lease ahead starts after this from what was mapped before it."""
    global _epoch
    with _lock:
        _epoch += 1
    with _busy:
        pass


def idle(timeout=None):
    """Wait until every job queued before this call is done (tests); False
    when timeout seconds passed first."""
    return _jobs.wait(timeout)


def _run(batch):
    """Lease ahead of the jobs queued since the worker last looked (a loop
    that maps faster than files are leased: of the latest of each
    directory)."""
    with _busy:
        todo = {}
        for epoch, path, device in batch:
            if epoch == _epoch and device is not None:
                _warm(device)
            if epoch == _epoch:
                try:
                    nxt = _successors(path)
                except OSError:
                    nxt = []
                todo[os.path.dirname(path)] = (epoch, nxt, device)
        for epoch, nxt, device in todo.values():
            _lease_all(epoch, nxt, device)


_warmed = set()  # CUDA ordinals whose driver and device name the client has looked up


def _warm(device):
    """What a process's first lease on device looks up once (the client's
    CUDA driver entry points, the device's UUID), looked up here, beside
    the loop, not in its first move."""
    if device in _warmed:
        return
    _warmed.add(device)
    try:
        import torch

        from .. import _device

        torch.cuda.set_device(device)
        _device.default_device()
    except Exception:
        _report.log.debug("gdsfs autoload: looking up CUDA device %s ahead", device, exc_info=True)


def _lease_all(epoch, paths, device):
    from . import _moves

    if not paths:
        return
    try:
        if device is not None:
            import torch

            torch.cuda.set_device(device)  # this thread's own: the leases go where the mapping thread's moves go
        for p in paths:
            if epoch != _epoch or not _on:
                return
            _moves.lease_ahead(p)
    except Exception:  # never the caller's problem: the moves lease what they need
        _report.log.debug("gdsfs autoload: leasing ahead of %s", paths[0], exc_info=True)


def _successors(path):
    """When path is the file after the one mapped last in its directory:
    that one, path, and the next AHEAD files after path with its
    extension (those leased already are passed over); else []."""
    d, name = os.path.split(path)
    prev = _last.pop(d, None)
    if len(_last) >= MAX_DIRS:
        _last.clear()
    _last[d] = name
    if prev is None or prev >= name:
        return []
    names = _listing(d)
    i = bisect.bisect_left(names, name)
    if i == 0 or i == len(names) or names[i] != name or names[i - 1] != prev:
        return []
    ext = os.path.splitext(name)[1]
    out = [os.path.join(d, prev), path]
    for n in names[i + 1:]:
        if len(out) == AHEAD + 2:
            break
        if os.path.splitext(n)[1] == ext:
            out.append(os.path.join(d, n))
    return out


def _listing(d):
    """d's names, sorted; listed again when d changed."""
    st = os.stat(d)
    was = _listings.get(d)
    if was is not None and was[:2] == (st.st_mtime_ns, st.st_ctime_ns):
        return was[2]
    names = sorted(os.listdir(d))
    if len(_listings) >= MAX_DIRS:
        _listings.clear()
    _listings[d] = (st.st_mtime_ns, st.st_ctime_ns, names)
    return names


def _after_fork_in_child():
    """The worker thread is the parent's (_jobs forgets it): a child starts
    with none."""
    global _lock, _busy
    _lock = threading.Lock()
    _busy = threading.Lock()
    _warmed.clear()
    _last.clear()
    _listings.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)
