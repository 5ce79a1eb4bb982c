"""Fallback accounting: every call the autoloader hands back to the original
function is counted here by reason, logged once per reason per process, and
reported to the daemon of the mount it concerns (the `report` op), so
`.gdsfs/stats` counts it too. The reports are sent by one background thread
(the call that fell back does not wait for a daemon round trip), in order,
and all of them before the process exits (flush(), at exit). Nothing here
may raise into the caller."""

import atexit
import errno as _errno
import json
import logging
import os
import socket
import threading

from .. import _proto
from ._queue import QueueThread

log = logging.getLogger("gdsfs.autoload")

_lock = threading.Lock()
_fallbacks = {}  # reason -> count in this process
_served = {}  # loader -> count of calls served from a lease
_logged = set()  # reasons already logged by this process
_no_report = set()  # sockets whose daemon answered EINVAL to `report`
_REPORT_TIMEOUT = 2.0
_sender = QueueThread("gdsfs-autoload-reports", lambda r: _send(*r))  # sends (socket path, reason, owner)
_queued = 0  # reports queued to _sender not sent yet
MAX_QUEUED = 1024  # beyond this (a daemon slow to answer), a fallback sends its report itself


def fallbacks():
    """{reason: count} of the calls handed to the original function in this
    process."""
    with _lock:
        return dict(_fallbacks)


def served():
    """{loader: count} of the calls served from leases in this process."""
    with _lock:
        return dict(_served)


def reset():
    """Forget the counts and the reasons already logged, once the reports
    queued are sent (tests)."""
    flush(60)
    with _lock:
        _fallbacks.clear()
        _served.clear()
        _logged.clear()
        _no_report.clear()


def count_served(loader):
    with _lock:
        _served[loader] = _served.get(loader, 0) + 1


def fallback(loader, reason, path=None, socket_path=None, detail=None):
    """Count one fallback of loader (e.g. "safetensors.load_file") for
    reason, log it the first time this process sees the reason, and report it
    to socket_path's daemon when the call concerned a mount."""
    try:
        with _lock:
            _fallbacks[reason] = _fallbacks.get(reason, 0) + 1
            first = reason not in _logged
            _logged.add(reason)
        if first:
            log.warning(
                "gdsfs autoload: %s of %s served by the original function (%s)%s; "
                "logged once per reason per process",
                loader, path if path is not None else "its input", reason,
                ": %s" % detail if detail else "",
            )
        owner = None
        if path is not None and reason not in ("not-gdsfs", "not-a-path", "untrusted-daemon"):
            t = mount_target(path)
            if t is not None:
                owner = t[1]
                if socket_path is None:
                    socket_path = t[0]
        if socket_path:
            _send_later(socket_path, reason, owner)
    except Exception:  # accounting must never break the caller's load
        log.debug("gdsfs autoload: counting a fallback failed", exc_info=True)


def _send_later(socket_path, reason, owner):
    """Queue the report for the sender thread (started on first use); sent
    here and now where no thread can be had, or MAX_QUEUED are waiting."""
    global _queued
    with _lock:
        try:
            if _sender.start():
                _flush_at_worker_exit()
        except RuntimeError:
            pass  # no thread can be had
        else:
            if _queued < MAX_QUEUED:
                _queued += 1
                _sender.put((socket_path, reason, owner))
                return
    _report(socket_path, reason, owner)


def _flush_at_worker_exit():
    """In a multiprocessing child (a DataLoader worker), which leaves by
    os._exit and so runs no atexit handler: flush the reports at its exit."""
    try:
        import multiprocessing
        from multiprocessing import util

        if multiprocessing.parent_process() is not None:
            util.Finalize(None, flush, args=(2 * _REPORT_TIMEOUT,), exitpriority=0)
    except Exception:
        log.debug("gdsfs autoload: no flush of the reports at a worker's exit", exc_info=True)


def _send(sock, reason, owner):
    global _queued
    with _lock:
        _queued -= 1
    try:
        _report(sock, reason, owner)
    except Exception:
        log.debug("gdsfs autoload: reporting a fallback failed", exc_info=True)


def flush(timeout=None):
    """Wait until the reports queued before this call are sent (and
    answered); False when timeout seconds passed first."""
    return _sender.wait(timeout)


# Each report waits at most _REPORT_TIMEOUT for its daemon; at exit the
# queue left is given that long in all.
atexit.register(flush, 2 * _REPORT_TIMEOUT)


def _after_fork_in_child():
    """The sender thread is the parent's (_sender forgets it): a child
    sends its own."""
    global _lock, _queued
    _lock = threading.Lock()
    _queued = 0


os.register_at_fork(after_in_child=_after_fork_in_child)


def mount_socket(path):
    """The lease socket of the gdsfs mount path is under, or None: a
    fallback that concerns a mount is counted in its .gdsfs/stats too."""
    t = mount_target(path)
    return t[0] if t is not None else None


def mount_target(path):
    """Where path's mount takes reports: (its lease socket, the mount's
    owner), or None. Found as a lease finds it (gdsfs._lease._locate,
    remembered per directory), so a fallback does not read the mount
    table again."""
    try:
        from .._lease import _locate

        sock, _, owner, _ = _locate(path, None)
        return sock, owner
    except Exception:
        return None


def _report(socket_path, reason, owner=None):
    """Send the report to socket_path, whose listener must be owner
    (None: root or this process's euid), as for a lease."""
    with _lock:
        if socket_path in _no_report:
            return
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.settimeout(_REPORT_TIMEOUT)
        s.connect(socket_path)
        _proto._check_peer(s, socket_path, owner)
        line = json.dumps({"op": "report", "event": "fallback", "reason": reason}, separators=(",", ":"))
        s.sendall(line.encode() + b"\n")
        buf = b""
        while b"\n" not in buf and len(buf) < 65536:
            d = s.recv(4096)
            if not d:
                break
            buf += d
    except OSError as e:
        log.debug("gdsfs autoload: reporting a fallback to %s: %s", socket_path, e)
        return
    finally:
        s.close()
    try:
        resp = json.loads(buf.partition(b"\n")[0].decode() or "{}")
    except ValueError:
        resp = {}
    if not resp.get("ok"):
        if resp.get("errno") == "EINVAL":
            with _lock:
                _no_report.add(socket_path)
            log.warning("gdsfs autoload: the daemon at %s does not count fallbacks (an older daemon "
                        "answered EINVAL to `report`); they are counted in this process only", socket_path)
        else:
            log.debug("gdsfs autoload: report to %s answered %r", socket_path, resp)


def errno_name(e):
    n = getattr(e, "errno", None)
    return _errno.errorcode.get(n, str(n)) if isinstance(n, int) else type(e).__name__
