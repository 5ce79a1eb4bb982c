"""gdsfs.open_many: many leases in as few round trips as possible."""

import errno as _errno

from ._proto import MAX_FDS, _close_fds, daemon_error, grant_fds, room_wait_fields  # noqa: F401 (MAX_FDS: see PROTOCOL)
from ._registry import registry
from ._lease import Lease, _drop_if_pressed, _give_back, _locator, _pooled, _resolve_device, _retry

MAX_BATCH = 1024  # paths per acquire_many (proto.MaxBatch)


def open_many(paths, *, socket=None, timeout=None, device=None, room_wait=None):
    """Lease many files at once; returns their leases in order. Files this
    process keeps mapped are leased again together on the connections that
    hold them (one acquire_many each, no descriptors when unchanged); the
    rest in one acquire_many per daemon, on a connection of the process's
    pool for it (see _registry). All or nothing: if any file
    fails, the leases already made are closed and its error is raised.
    device, room_wait: as gdsfs.open's, for every file."""
    dev = _resolve_device(device)
    room = room_wait_fields(room_wait)
    paths = list(paths)
    out = [None] * len(paths)
    taken = []  # mappings taken for a repeat lease, not yet settled
    try:
        fresh = []
        groups = {}
        owners = {}
        locate = _locator(socket)
        for i, p in enumerate(paths):
            sock, rel, owners[sock], _ = locate(p)
            m = registry.take((sock, rel, dev))
            if m is None:
                fresh.append((i, sock, rel, None))
            else:
                taken.append(m)
                groups.setdefault(id(m.holder), (m.holder, []))[1].append((i, sock, rel, m))
        for holder, items in groups.values():
            fresh += _repeat_group(paths, holder, items, out, taken, dev, room)
        by_socket = {}
        for it in fresh:
            by_socket.setdefault(it[1], []).append(it)
        for sock, items in by_socket.items():
            for k in range(0, len(items), MAX_BATCH):
                _batch(paths, sock, owners.get(sock), items[k:k + MAX_BATCH], out, timeout, dev, room)
    except BaseException:
        for m in taken:
            registry.discard(m)
        for lease in out:
            if lease is not None:
                try:
                    lease.close()
                except Exception:
                    pass
        raise
    return out


def _settle(taken, m):
    for k, t in enumerate(taken):
        if t is m:
            del taken[k]
            return


def _many(rels, dev, **extra):
    """An acquire_many request for rels on device dev (None: none named)."""
    req = {"op": "acquire_many", "paths": list(rels)}
    req.update(extra)
    if dev is not None:
        req["device"] = dev
    return req


def _give_back_rest(conn, answers, epoch):
    """Give back the granted items of an answer not turned into leases: a
    reuse is released, a full grant released and dropped."""
    for a in answers:
        if a.get("ok") and not conn.closed:
            if a.get("reuse"):
                conn.release(a.get("lease", 0), epoch)
            else:
                _give_back(conn, a, epoch)


def _repeat_group(paths, holder, items, out, taken, dev, room):
    """Lease items again on the connection holding their mappings; return
    the items to lease afresh (changed files, or a broken connection)."""
    conn = holder.conn
    req = _many([it[2] for it in items], dev, generations=[it[3].generation for it in items], **room)
    try:
        resp, fds = conn.request(req)
        files = resp.get("files") or []
        if len(files) != len(items):
            _close_fds(fds)
            _give_back_rest(conn, files, resp.get("epoch"))
            raise OSError(_errno.EPROTO, "gdsfs acquire_many: %d answers for %d files" % (len(files), len(items)))
    except OSError as e:
        for it in items:
            _settle(taken, it[3])
            registry.discard(it[3])
        if not _retry(e):
            raise
        return items
    again = []
    for k, (it, a) in enumerate(zip(items, files)):
        i, sock, rel, m = it
        n = grant_fds(a)
        got, fds = fds[:n], fds[n:]
        _settle(taken, m)
        if a.get("ok") and a.get("reuse") and a.get("generation") == m.generation:
            out[i] = Lease(m, conn, dict(a, epoch=resp.get("epoch")), paths[i])
            continue
        if a.get("ok") and not a.get("reuse"):
            try:
                nm = registry.adopt(holder, (sock, rel, dev), a, got, paths[i])
            except BaseException:
                _give_back(conn, a, resp.get("epoch"))
                _give_back_rest(conn, files[k + 1:], resp.get("epoch"))
                registry.discard(m)
                _close_fds(fds)
                raise
            registry.discard(m)
            out[i] = Lease(nm, conn, dict(a, epoch=resp.get("epoch")), paths[i])
            continue
        registry.discard(m)
        if a.get("ok"):  # a reuse of another generation: the daemon broke the protocol
            conn.release(a.get("lease", 0), resp.get("epoch"))
            _give_back_rest(conn, files[k + 1:], resp.get("epoch"))
            _close_fds(fds)
            raise OSError(_errno.EPROTO, "gdsfs acquire %s: reuse of generation %s answered for %s"
                          % (paths[i], a.get("generation"), m.generation))
        err = daemon_error(a, paths[i])
        if not _retry(err):
            _give_back_rest(conn, files[k + 1:], resp.get("epoch"))
            _close_fds(fds)
            raise err
        again.append((i, sock, rel, None))
    _close_fds(fds)
    return again


def _batch(paths, sock, owner, items, out, timeout, dev, room):
    """Lease items on a connection of the process's pool for sock (_pooled)."""
    req = _many([it[2] for it in items], dev, **room)
    holder, (resp, fds) = _pooled((sock, owner, timeout), lambda conn: conn.request(req))
    conn = holder.conn
    files = resp.get("files") or []
    first = None
    try:
        if len(files) != len(items):
            _give_back_rest(conn, files, resp.get("epoch"))
            raise OSError(_errno.EPROTO, "gdsfs acquire_many: %d answers for %d files" % (len(files), len(items)))
        for (i, _, rel, _m), a in zip(items, files):
            n = grant_fds(a)
            got, fds = fds[:n], fds[n:]
            if first is not None:
                _close_fds(got)
                if a.get("ok") and not conn.closed:
                    _give_back(conn, a, resp.get("epoch"))  # open while earlier files are leased
                continue
            if not a.get("ok"):
                first = daemon_error(a, paths[i])
                continue
            try:
                m = registry.adopt(holder, (sock, rel, dev), a, got, paths[i])
            except Exception as e:  # mapping failed: give it back, and the rest below
                _give_back(conn, a, resp.get("epoch"))
                first = e
                continue
            out[i] = Lease(m, conn, dict(a, epoch=resp.get("epoch")), paths[i])
    finally:
        _close_fds(fds)
        registry.checkin(holder)
    if first is not None:
        _drop_if_pressed(first, sock)
        raise first
    if not all(a.get("cache") for a in files):
        registry.flush(sock)
