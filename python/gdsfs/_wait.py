"""gdsfs.wait and gdsfs.wait_stat: block until the daemon says a file
reached a state, or a lease counter a value. The daemon answers when the
change happens (proto/PROTOCOL.md, wait and wait_stat): nothing polls."""

import errno as _errno
import time

from ._mount import find
from ._proto import MAX_WAIT_MS, Conn, wait_ms, wait_request, wait_stat_request

__all__ = ["wait", "wait_stat"]

_SLACK = 10.0  # seconds the socket waits past the daemon's own bound


def _ask(t, make, timeout, path):
    """Send make(ms) until answered; a wait longer than the daemon's bound
    (MAX_WAIT_MS) is asked again for the rest."""
    deadline = time.monotonic() + timeout
    left = timeout
    while True:
        ms = wait_ms(left)
        conn = Conn(t.socket, ms / 1000.0 + _SLACK, t.owner)
        try:
            resp, _ = conn.request(make(ms), path=path)
            return resp
        except OSError as e:
            left = deadline - time.monotonic()
            if not (ms == MAX_WAIT_MS and e.errno == _errno.ETIMEDOUT and left > 0):
                raise
        finally:
            conn.close()


def wait(path, until=("resident", "failed"), *, timeout=60.0, socket=None):
    """Block until path's state (as gdsfs.stat reports it) is one of until
    ("absent", "resident", "failed"; a failed state is "failed: REASON"),
    at most timeout seconds, and return what stat would: a dict with size,
    state, load_path. Raises TimeoutError (ETIMEDOUT) when the state does
    not come, PermissionError when the caller may not read the file."""
    t = find(path, socket)
    resp = _ask(t, lambda ms: wait_request(t.rel, until, ms), timeout, path)
    out = {k: v for k, v in resp.items() if k != "ok"}
    out.setdefault("size", 0)
    out.setdefault("state", "")
    out.setdefault("load_path", "")
    return out


def wait_stat(path, key, value, *, timeout=60.0, socket=None):
    """Block until the daemon's lease counter key (a stats.json key:
    leases_active, lease_held_bytes, lease_held_files,
    lease_holding_connections, ipc_open_connections, which leaves out this
    request's own connection) equals value, at most timeout seconds
    (TimeoutError after). path is any path under the mount (or give
    socket)."""
    _ask(find(path, socket), lambda ms: wait_stat_request(key, value, ms), timeout, None)
