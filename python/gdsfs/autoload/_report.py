"""Fallback accounting: every call the autoloader hands back to the original
function is counted here by reason, logged once per reason per process, and
reported to the daemon of the mount it concerns (the `report` op), so
`.gdsfs/stats` counts it too. Nothing here may raise into the caller."""

import errno as _errno
import json
import logging
import socket
import threading

from .. import _proto

log = logging.getLogger("gdsfs.autoload")

_lock = threading.Lock()
_fallbacks = {}  # reason -> count in this process
_served = {}  # loader -> count of calls served from a lease
_logged = set()  # reasons already logged by this process
_no_report = set()  # sockets whose daemon answered EINVAL to `report`
_REPORT_TIMEOUT = 2.0


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
    """Forget the counts and the reasons already logged (tests)."""
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
            _report(socket_path, reason, owner)
    except Exception:  # accounting must never break the caller's load
        log.debug("gdsfs autoload: counting a fallback failed", exc_info=True)


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
