"""The package's release and its check against a daemon's.

The release is the VERSION file beside this module: the gdsfs binary
embeds the same file, so a package and a binary built from one tree have
one release. check_daemon asks a daemon its release and protocol version
(the hello request, proto/PROTOCOL.md) and decides:

- refused (VersionMismatchError): the daemon speaks an older protocol than
  this package (it would refuse requests this package makes);
- warned (VersionWarning, once per daemon per process): the releases
  differ, or the daemon is too old to say its release. The protocol is
  the contract, so such a client works; the warning says which versions
  met and how to line them up.
"""

import errno as _errno
import os
import threading
import warnings

from ._mount import find
from ._proto import PROTOCOL, Conn

__all__ = ["RELEASE", "VersionMismatchError", "VersionWarning", "check_daemon"]


def _read_release():
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "VERSION")) as f:
        return f.read().strip()


RELEASE = _read_release()


class VersionWarning(UserWarning):
    """This package and the daemon come from different releases."""


class VersionMismatchError(RuntimeError):
    """The daemon speaks an older protocol than this package."""


_lock = threading.Lock()
_warned = set()  # sockets warned about in this process


def _printable(text):
    """text with its control characters (escape sequences, line breaks)
    shown escaped, for a message that reaches a terminal."""
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


def _protocol_error(sock, field, value):
    return OSError(_errno.EPROTO, "gdsfs: the daemon at %s answered hello with %s %s: %s"
                   % (sock, field, ascii(value)[:200], "want a number" if field == "version" else "want a string"))


def _public(version):
    """The release part of a version ("0.2.0" of "0.2.0+c40264d-dirty")."""
    return version.split("+", 1)[0]


def check_daemon(path, *, socket=None, timeout=10.0):
    """Ask the daemon serving path (a path under a gdsfs mount, or give
    socket) its versions and compare them with this package's; return the
    daemon's hello answer (a dict: version, ops, max_fds, devices, and
    release where the daemon says it). Raises VersionMismatchError when
    the daemon's protocol is older than this package's; warns
    (VersionWarning) when only the releases differ."""
    t = find(path, socket)
    conn = Conn(t.socket, timeout, t.owner)
    try:
        try:
            resp, _ = conn.request({"op": "hello", "version": PROTOCOL, "release": RELEASE}, path=path)
        except OSError as e:
            if e.errno != _errno.EINVAL or not getattr(e, "gdsfs_answer", False):
                raise
            # A daemon older than release reporting refuses the field.
            resp, _ = conn.request({"op": "hello", "version": PROTOCOL}, path=path)
    finally:
        conn.close()
    theirs = resp.get("version", 0)
    if isinstance(theirs, bool) or not isinstance(theirs, int):
        raise _protocol_error(t.socket, "version", theirs)
    if theirs < PROTOCOL:
        raise VersionMismatchError(
            "gdsfs: the daemon at %s speaks protocol version %d; this gdsfs Python package (%s) needs %d: "
            "upgrade the daemon, or install the package that matches it (`gdsfs version` names its release)"
            % (t.socket, theirs, RELEASE, PROTOCOL))
    release = resp.get("release")
    if release is not None and not isinstance(release, str):
        raise _protocol_error(t.socket, "release", release)
    if release is None or _public(release) != RELEASE:
        with _lock:
            first = t.socket not in _warned
            _warned.add(t.socket)
        if first:
            said = "does not say its release (it predates release reporting)" if release is None else "is gdsfs %s" % _printable(release)
            warnings.warn(
                "gdsfs: the daemon at %s %s, this Python package is %s; both speak protocol %d, so leases work, "
                "but install the package that matches the daemon (make wheel in its tree, or use `gdsfs run`, "
                "which loads the binary's own copy)" % (_printable(t.socket), said, RELEASE, PROTOCOL),
                VersionWarning, stacklevel=2)
    return resp
