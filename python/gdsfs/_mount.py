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


# Where the mount table is read (tests of a daemon served without a FUSE
# mount point it at a file of their own).
MOUNTINFO = "/proc/self/mountinfo"


class MountEntry:
    __slots__ = ("majmin", "root", "mountpoint", "fstype", "owner")

    def __init__(self, majmin, root, mountpoint, fstype, owner=None):
        self.majmin, self.root, self.mountpoint, self.fstype = majmin, root, mountpoint, fstype
        self.owner = owner  # the user_id= super option (None: absent)

    def __repr__(self):
        return "MountEntry(%r, %r, %r, %r, owner=%r)" % (self.majmin, self.root, self.mountpoint, self.fstype, self.owner)


def _owner(superopts):
    for o in superopts.split(b","):
        if o.startswith(b"user_id="):
            try:
                return int(o[len(b"user_id="):])
            except ValueError:
                return None
    return None


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
                _owner(fields[sep + 3]) if sep + 3 < len(fields) else None,
            )
        )
    return out


def read_mountinfo(path=None):
    with open(MOUNTINFO if path is None else path, "rb") as f:
        return parse_mountinfo(f.read())


def _resolve(path):
    """Absolute path with its symlinks resolved, the file's own too, so the
    path sent names the file a plain open reads (a link that leads off the
    mount, or out of a bind mount of a directory of it, is not sent). The
    kernel walks it (an O_PATH open, named back by /proc/self/fd), so a
    `..` goes up from where the links before it lead. A last name that
    does not exist is kept, in the directory the walk of the rest
    reaches. Where the walk fails otherwise, a path with a `..` (whose
    text may name a file the walk never reaches: a link, a missing name
    or a file before the `..`), or one ending in `/`, raises the walk's
    OSError; any other is resolved as far as this process may look
    (its links, of the names that exist and that it may reach), the rest
    kept as it is: the daemon, which walks SOURCE as the caller, says
    what is wrong with it."""
    p = os.fsdecode(os.fspath(path))
    try:
        return _walked(p)
    except OSError as e:
        err = e
    d, base = os.path.split(p)
    if err.errno == _errno.ENOENT and base not in ("", ".", ".."):
        try:
            return os.path.join(_walked(d or "."), base)
        except OSError:
            pass
    if has_dot_dot(p) or p.endswith(os.sep):
        err.gdsfs_path = True  # the path's own fault, not the daemon's
        raise err
    return os.path.realpath(os.path.abspath(p))


def has_dot_dot(p):
    """Whether path p (a str) has a `..` component."""
    return ".." in p.split(os.sep)


def _walked(p):
    """The path the kernel's walk of p reaches, every link followed."""
    fd = os.open(p, os.O_PATH | os.O_CLOEXEC)
    try:
        return os.readlink("/proc/self/fd/%d" % fd)
    finally:
        os.close(fd)


class Target:
    """Where a path is leased from: socket, rel (the path to send), mount
    (the mount point it is under), owner (the mount's user_id: its daemon
    must run as that uid or root; None when mountinfo does not say)."""

    __slots__ = ("socket", "rel", "mount", "owner")

    def __init__(self, socket, rel, mount, owner):
        self.socket, self.rel, self.mount, self.owner = socket, rel, mount, owner


def locate(path, socket=None, mountinfo=None):
    """(socket path, path to send, mount directory) for path.

    The nearest mount point at or above the file must be a gdsfs mount
    (a path under no gdsfs mount is never sent anywhere); the path
    relative to it is sent, to the socket named by the socket argument,
    else env GDSFS_SOCKET, else the mount's .gdsfs/socket."""
    t = find(path, socket, mountinfo)
    return t.socket, t.rel, t.mount


def find(path, socket=None, mountinfo=None):
    """locate's answer as a Target, with the mount's owner."""
    p = _resolve(path)
    sock = socket or os.environ.get("GDSFS_SOCKET")
    entries = read_mountinfo() if mountinfo is None else mountinfo
    table = {}
    for e in entries:
        table[e.mountpoint] = e  # the last mount on a path is the visible one
    d = p
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
        if not roots and not sock:
            raise NotMountedError(
                _errno.ENODEV,
                "on %s, a bind mount of %s inside a gdsfs mount whose root is not mounted "
                "here; set GDSFS_SOCKET to its lease socket" % (d, e.root),
                os.fspath(path),
            )
        ctl = roots[-1].mountpoint if roots else None
    if sock:
        return Target(sock, rel, d, e.owner)
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
    return Target(sock, rel, d, e.owner)
