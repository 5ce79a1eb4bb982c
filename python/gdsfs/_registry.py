"""This process's mapped files: one mapping per file, shared by its leases,
kept after the last lease closes while the daemon allows it (the
repeat-lease fast path), and the connections that hold them.

The daemon holds every file granted on a connection until the connection
closes or the client drops it (proto/PROTOCOL.md). Fresh leases (gdsfs.open,
and open_many's batches) are made on a connection of the process's pool
for that daemon that no other request is using, a new one where all are
busy; repeat leases on the connection holding their mapping. A mapping
undone while its connection holds others is dropped on it; a connection is
closed when the last mapping it holds is undone and no request uses it.
So a process holds about as many connections as it makes requests at
once, and an idle one none.
"""

import collections
import errno as _errno
import logging
import os
import threading

from ._proto import _close_fds

log = logging.getLogger("gdsfs")

# Mappings kept with no lease using them, and connections this process
# holds with mappings on them: past either bound the oldest kept mappings
# are undone. Connections are few: every process of a uid shares the
# daemon's ipc.max_connections_per_uid (1024 by default), and an idle
# process must not hold a share of it.
MAX_IDLE = 4096
MAX_CONNS = 16


def _is_gpu(device):
    return isinstance(device, str) and device.startswith("GPU-")


def _is_host(device):
    """"host", or "hostN" for one of several host devices."""
    return isinstance(device, str) and (device == "host" or (device.startswith("host") and device[4:].isdigit()))


class Holder:
    """A connection of the registry's, how many mappings it holds and how
    many requests use it: closed with its last mapping once no request
    uses it."""

    __slots__ = ("conn", "refs", "busy")

    def __init__(self, conn):
        self.conn = conn
        self.refs = 0
        self.busy = 0


class Mapped:
    """One file's mapping in this process."""

    __slots__ = ("key", "holder", "generation", "size", "device", "sharing", "chunks", "mapping", "users",
                 "cache", "stale", "pid")

    def __init__(self, key, holder, grant, mapping):
        self.key = key
        self.holder = holder
        self.generation = grant.get("generation", 0)
        self.size = int(grant.get("size", 0))
        self.device = grant.get("device", "")
        self.sharing = grant.get("sharing", "")
        self.chunks = tuple(int(c.get("len", 0)) for c in (grant.get("chunks") or []))
        self.mapping = mapping
        self.users = 1
        self.cache = bool(grant.get("cache")) and self.sharing == "shared" and key is not None
        self.stale = False
        self.pid = os.getpid()


def map_grant(grant, fds, what):
    """Map a grant's descriptors (closing them)."""
    try:
        chunks = [int(c.get("len", 0)) for c in (grant.get("chunks") or [])]
        size = int(grant.get("size", 0))
        writable = grant.get("sharing") == "private"
        device = grant.get("device", "")
        if len(fds) != len(chunks):
            raise OSError(_errno.EPROTO, "gdsfs acquire %s: %d descriptors for %d chunks" % (what, len(fds), len(chunks)))
        if _is_gpu(device):
            from ._cuda import CudaMapping

            return CudaMapping(device, fds, chunks, size, writable)
        if _is_host(device):
            from ._host import HostMapping

            return HostMapping(fds, chunks, size, writable)
        raise OSError(_errno.EPROTO, "gdsfs acquire %s: unknown device %r" % (what, device))
    finally:
        _close_fds(fds)


class Registry:
    def __init__(self):
        self.lock = threading.Lock()
        self.pid = os.getpid()
        self.files = {}  # key -> current Mapped
        self.idle = collections.OrderedDict()  # Mapped -> None, most recent last
        self.conns = 0  # registry-opened connections holding mappings
        self.pools = {}  # (socket, owner, timeout) -> the Holders fresh leases are made on

    def after_fork_in_child(self):
        """In a forked child: close this process's copies of the parent's
        connections (a copy keeps the daemon holding what they were
        granted, the parent's kept mappings included) and forget them."""
        self.lock = threading.Lock()  # another thread of the parent may have held it
        held = {}
        for m in list(self.files.values()) + list(self.idle):
            held[id(m.holder)] = m.holder
        for hs in self.pools.values():  # those a request of another thread used at the fork too
            for h in hs:
                held[id(h)] = h
        for h in held.values():
            h.conn.close()
        self.pid = os.getpid()
        self.files = {}
        self.idle = collections.OrderedDict()
        self.conns = 0
        self.pools = {}

    def _forked_locked(self):
        """In a forked child the parent's mappings and connections are not
        ours to use (a CUDA mapping is not valid there): start afresh."""
        if self.pid != os.getpid():
            self.pid = os.getpid()
            self.files = {}
            self.idle = collections.OrderedDict()
            self.conns = 0
            self.pools = {}

    def lease_holder(self, where, connect):
        """A connection for a fresh lease to where (socket, owner, timeout),
        marked busy (checkin gives it back), and whether it is new: the
        first of where's connections that no request uses, else a new one
        (connect()), which joins them. A connection whose daemon does not
        know drop is not used again for fresh leases."""
        with self.lock:
            self._forked_locked()
            for h in self.pools.get(where, ()):
                if h.busy == 0 and not h.conn.closed and not h.conn.no_drop:
                    h.busy = 1
                    return h, False
        h = Holder(connect())
        h.busy = 1
        with self.lock:
            self._forked_locked()
            self.pools.setdefault(where, []).append(h)
        return h, True

    def checkin(self, holder):
        """A request on holder ended: close it if it holds no mapping."""
        with self.lock:
            holder.busy -= 1
            closing = holder.busy == 0 and holder.refs <= 0
            if closing:
                self._forget_locked(holder)
        if closing:
            holder.conn.close()

    def _forget_locked(self, holder):
        for k, hs in list(self.pools.items()):
            rest = [h for h in hs if h is not holder]
            if rest:
                self.pools[k] = rest
            else:
                del self.pools[k]

    def take(self, key):
        """The current mapping of key, counted as used, if one is worth a
        repeat lease."""
        with self.lock:
            self._forked_locked()
            m = self.files.get(key)
            if m is None or m.stale or m.holder.conn.closed:
                return None
            m.users += 1
            self.idle.pop(m, None)
            return m

    def adopt(self, holder, key, grant, fds, what):
        """Map a grant as the current mapping of key, held by holder, with
        one user."""
        m = Mapped(key, holder, grant, map_grant(grant, fds, what))
        with self.lock:
            self._forked_locked()
            holder.refs += 1
            if holder.refs == 1:
                self.conns += 1
            drop = []
            if key is not None:
                old = self.files.get(key)
                if old is not None:
                    old.stale = True
                    if old.users == 0:
                        self._remove_locked(old)
                        drop.append(old)
                self.files[key] = m
            closing = self._unref_locked(drop)
        _undo(drop, closing)
        return m

    def discard(self, m):
        """Give back a mapping taken for a repeat lease that failed; it is
        not handed out again."""
        with self.lock:
            m.users -= 1
            m.stale = True
            drop = []
            if m.users <= 0:
                self._remove_locked(m)
                drop.append(m)
            closing = self._unref_locked(drop)
        _undo(drop, closing)

    def finish(self, m, conn, lease_id, epoch):
        """A lease of m ended: keep m for a repeat lease if the daemon
        allowed it, else undo it (closing its connection with its last
        mapping). The lease id is released unless its connection closes.
        Returns the unmapping errors."""
        forked = m.pid != os.getpid()
        with self.lock:
            m.users -= 1
            drop, closing = [], []
            if m.users <= 0:
                if m.cache and not m.stale and not forked and not m.holder.conn.closed:
                    self.idle[m] = None
                    while self.idle and (len(self.idle) > MAX_IDLE or self.conns > MAX_CONNS):
                        v, _ = self.idle.popitem(last=False)
                        self._remove_locked(v)
                        drop.append(v)
                        closing += self._unref_locked([v])
                else:
                    self._remove_locked(m)
                    drop.append(m)
                    closing = self._unref_locked(drop)
        if forked:
            # A forked child: leave the parent's mapping and connection
            # alone (closing this copy of the socket ends nothing).
            m.holder.conn.close()
            return []
        if not any(h.conn is conn for h in closing):
            conn.release(lease_id, epoch)
        return _undo(drop, closing)

    def flush(self, socket=None):
        """Undo the kept mappings (of socket's daemon, or all)."""
        with self.lock:
            self._forked_locked()
            drop = [m for m in self.idle if socket is None or m.holder.conn.path == socket]
            for m in drop:
                self._remove_locked(m)
            closing = self._unref_locked(drop)
        for e in _undo(drop, closing):
            log.warning("gdsfs: unmapping a kept lease: %s", e)

    def _remove_locked(self, m):
        self.idle.pop(m, None)
        if m.key is not None and self.files.get(m.key) is m:
            del self.files[m.key]
        m.stale = True

    def _unref_locked(self, drop):
        closing = []
        for m in drop:
            m.holder.refs -= 1
            if m.holder.refs <= 0:
                if m.pid == os.getpid():  # not a mapping inherited over fork
                    self.conns -= 1
                if m.holder.busy == 0:
                    closing.append(m.holder)
                    self._forget_locked(m.holder)
        return closing


def _undo(drop, closing):
    """Unmap, then close the connections (the daemon then ends what they
    held) or, on a connection that stays open, drop what was unmapped.
    Returns the unmapping errors."""
    errs = []
    pid = os.getpid()
    for m in drop:
        mp, m.mapping = m.mapping, None
        if mp is not None:
            try:
                mp.close()
            except Exception as e:
                errs.append(e)
                continue  # still mapped: the daemon goes on holding it
        if m.pid == pid and not any(h is m.holder for h in closing):
            m.holder.conn.drop(m.generation, m.device)
    for h in closing:
        h.conn.close()
    return errs


registry = Registry()
os.register_at_fork(after_in_child=registry.after_fork_in_child)
