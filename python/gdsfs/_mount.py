"""Finding the gdsfs mount that holds a path, and its lease socket."""

import errno as _errno
import os
import re

from ._proto import NotMountedError

FSTYPE = "fuse.gdsfs"
_OCTAL = re.compile(rb"\\([0-7]{3})")


def unescape(field):
    r"""Undo mountinfo's octal escapes (\040 space, \011 tab, \012 newline,
    \134 backslash) of one field (bytes)."""
    return _OCTAL.sub(lambda m: bytes([int(m.group(1), 8) & 0xFF]), field)


class MountEntry:
    __slots__ = ("majmin", "root", "mountpoint", "fstype")

    def __init__(self, majmin, root, mountpoint, fstype):
        self.majmin, self.root, self.mountpoint, self.fstype = majmin, root, mountpoint, fstype

    def __repr__(self):
        return "MountEntry(%r, %r, %r, %r)" % (self.majmin, self.root, self.mountpoint, self.fstype)


def parse_mountinfo(data):
    """Entries of a /proc/self/mountinfo text (bytes), in order."""
    out = []
    for line in data.split(b"\n"):
        fields = line.split(b" ")
        if len(fields) < 7:
            continue
        try:
            sep = fields.index(b"-", 6)
        except ValueError:
            continue
        if sep + 1 >= len(fields):
            continue
        out.append(
            MountEntry(
                fields[2].decode("ascii", "replace"),
                os.fsdecode(unescape(fields[3])),
                os.fsdecode(unescape(fields[4])),
                os.fsdecode(unescape(fields[sep + 1])),
            )
        )
    return out


def read_mountinfo(path="/proc/self/mountinfo"):
    with open(path, "rb") as f:
        return parse_mountinfo(f.read())


def _resolve(path):
    """Absolute path with the directory's symlinks resolved (not the file's)."""
    p = os.path.abspath(os.fspath(path))
    d, base = os.path.split(p)
    return os.path.join(os.path.realpath(d), base)


def locate(path, socket=None, mountinfo=None):
    """(socket path, path to send, mount directory or None) for path.

    An explicit socket (or env GDSFS_SOCKET) wins; the absolute path is then
    sent. Otherwise the nearest mount point above the file must be a gdsfs
    mount; its .gdsfs/socket names the socket and the path relative to the
    mount is sent."""
    p = _resolve(path)
    sock = socket or os.environ.get("GDSFS_SOCKET")
    if sock:
        return sock, p, None
    entries = read_mountinfo() if mountinfo is None else mountinfo
    table = {}
    for e in entries:
        table[e.mountpoint] = e  # the last mount on a path is the visible one
    d = os.path.dirname(p)
    while True:
        e = table.get(d)
        if e is not None:
            break
        parent = os.path.dirname(d)
        if parent == d:
            raise NotMountedError(_errno.ENODEV, "not under a gdsfs mount (no mount point found)", os.fspath(path))
        d = parent
    if e.fstype != FSTYPE:
        raise NotMountedError(
            _errno.ENODEV,
            "not under a gdsfs mount: it is on %s (%s)" % (e.mountpoint, e.fstype),
            os.fspath(path),
        )
    rel = os.path.relpath(p, d)
    ctl = d
    if e.root not in ("/", ""):
        # A bind mount of a directory inside a gdsfs mount: the daemon wants
        # the path from its SOURCE root, and .gdsfs lives only at the root.
        rel = os.path.normpath(os.path.join(e.root.lstrip("/"), rel))
        roots = [x for x in entries if x.majmin == e.majmin and x.root == "/" and x.fstype == FSTYPE]
        if not roots:
            raise NotMountedError(
                _errno.ENODEV,
                "on %s, a bind mount of %s inside a gdsfs mount whose root is not mounted "
                "here; set GDSFS_SOCKET to its lease socket" % (d, e.root),
                os.fspath(path),
            )
        ctl = roots[-1].mountpoint
    try:
        with open(os.path.join(ctl, ".gdsfs", "socket")) as f:
            sock = f.readline().strip()
    except OSError as err:
        raise OSError(
            err.errno,
            "gdsfs mount %s has no readable .gdsfs/socket (%s); set GDSFS_SOCKET" % (ctl, err.strerror),
            os.fspath(path),
        ) from None
    if not sock:
        raise OSError(_errno.EIO, "gdsfs mount %s: .gdsfs/socket is empty" % ctl, os.fspath(path))
    return sock, rel, d
