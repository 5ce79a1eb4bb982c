"""What every served load shares: taking the lease (or the reason not to),
the caller's file as a path, the device asked for, the env policies, and
bypassing the patches while an original function runs."""

import contextlib
import errno as _errno
import io
import os
import stat as _stat
import threading

import gdsfs
from gdsfs import _proto
from gdsfs._registry import _is_gpu

from . import _report

_HELLO_TIMEOUT = 5.0  # seconds

# How long a served load lets the daemon wait for room (capacity or the
# uid's ipc.max_held_per_uid held by other leases) before it falls back
# (refused:ENOSPC, refused:EDQUOT): the original loader reading through
# the mount starts at once, where a wait for room can last the daemon's
# whole ipc.acquire_timeout. Staging the file is not cut short by it.
ROOM_WAIT = 0.1  # seconds

_tls = threading.local()

# Directories whose files were leased from a GPU (True) or host (False)
# mount: CPU requests there skip the lease (see cpu_policy).
_gpu_dirs = {}
# Daemons' answers to hello by socket (mount_is_gpu).
_hello = {}
_hello_lock = threading.Lock()


class Fallback(Exception):
    """The call cannot be served from a lease: hand it to the original."""

    def __init__(self, reason, socket=None, detail=None):
        super().__init__(reason)
        self.reason = reason
        self.socket = socket
        self.detail = detail


def zero_copy():
    """GDSFS_ZERO_COPY=1: hand read-only views of the lease, not copies."""
    return os.environ.get("GDSFS_ZERO_COPY", "").lower() in ("1", "true", "yes", "on")


def cpu_policy():
    """GDSFS_AUTOLOAD_CPU: where a CPU tensor is asked for and the file is
    staged on a GPU. "original" (the default; measured slower through the
    lease, see README) or "lease" (device-to-host copies from the lease)."""
    v = os.environ.get("GDSFS_AUTOLOAD_CPU", "original").lower()
    return v if v in ("original", "lease") else "original"


@contextlib.contextmanager
def bypass():
    """Run an original function with the patches passing straight through
    (an original load_file calls safe_open, which is patched too)."""
    prev = getattr(_tls, "bypass", False)
    _tls.bypass = True
    try:
        yield
    finally:
        _tls.bypass = prev


def bypassed():
    return getattr(_tls, "bypass", False)


def path_of(f):
    """The absolute path of f (a path, or a file object at position 0
    opened on a regular file), or None when f is neither."""
    if isinstance(f, (str, bytes, os.PathLike)):
        try:
            p = os.fsdecode(os.fspath(f))
        except TypeError:
            return None
        # absolute, its `..` left for the walk to resolve after the links before it
        return p if os.path.isabs(p) else os.path.join(os.getcwd(), p)
    fileno = getattr(f, "fileno", None)
    if fileno is None:
        return None
    try:
        fd = fileno()
        if f.tell() != 0:
            return None
        p = os.readlink("/proc/self/fd/%d" % fd)
        a, b = os.fstat(fd), os.stat(p)
    except (OSError, ValueError, AttributeError, TypeError):
        return None
    if not _stat.S_ISREG(a.st_mode) or (a.st_dev, a.st_ino) != (b.st_dev, b.st_ino):
        return None
    if isinstance(f, io.TextIOBase):
        return None
    return p


def mount_is_gpu(path):
    """True when the gdsfs mount path is under stages onto a GPU, False on
    the host backend, None when it cannot tell (not a mount, no daemon, a
    daemon whose hello names no devices, or that did not answer). Known
    from a lease of a file in the same directory, else asked once per
    daemon with hello, which stages nothing: a CPU load from a GPU mount is
    left to the original loader without a lease making the daemon stage
    the file beside it."""
    d = os.path.dirname(path)
    known = _gpu_dirs.get(d)
    if known is not None:
        return known
    t = _report.mount_target(path)
    if t is None:
        return None
    sock, owner = t
    with _hello_lock:
        gpu = _hello.get(sock)
    if gpu is None:
        gpu = _ask_hello(sock, owner)
        if gpu is not None:  # only a definite answer is kept: a daemon away now may answer later
            with _hello_lock:
                _hello[sock] = gpu
    if gpu is not None:
        _remember(d, gpu)
    return gpu


def _ask_hello(sock, owner):
    """Whether the daemon on sock (its listener the mount's owner) stages onto a GPU, by its hello; None when it cannot tell."""
    try:
        conn = _proto.Conn(sock, _HELLO_TIMEOUT, owner=owner)
        try:
            resp, _ = conn.request({"op": "hello", "version": 1})
        finally:
            conn.close()
        devs = resp.get("devices")
        if isinstance(devs, list) and devs and isinstance(devs[0], str):
            return _is_gpu(devs[0])
    except Exception:  # no answer, or not one this client understands
        pass
    return None


def _remember(d, gpu):
    if len(_gpu_dirs) >= 4096:
        _gpu_dirs.clear()
    _gpu_dirs[d] = gpu


_socket_of = _report.mount_socket


_older = set()  # lease sockets whose daemon refused resident or identity (an older daemon)


def knows_resident(path):
    """Whether path's daemon is not known to refuse acquire's resident
    (an older daemon: then only the mount tells what is resident)."""
    return not _older or _socket_of(path) not in _older


def acquire(path, resident=False):
    """gdsfs.open(path), waiting at most ROOM_WAIT for room and asking
    for the grant's identity (Lease.identity), or Fallback with the
    reason it was not possible. resident: lease only a file resident now
    (Fallback "refused:ENODATA" for one that is not; "refused:EINVAL"
    from a daemon that does not know the field, which is then not asked
    again: knows_resident)."""
    try:
        lease = _open(path, resident)
    except gdsfs.NotMountedError:
        raise Fallback("not-gdsfs") from None
    except gdsfs.UntrustedDaemonError as e:
        raise Fallback("untrusted-daemon", None, str(e)) from None
    except OSError as e:
        if getattr(e, "gdsfs_answer", False):
            raise Fallback("refused:" + _report.errno_name(e), _socket_of(path), str(e)) from None
        if getattr(e, "gdsfs_path", False):  # the kernel's walk of the path fails: no daemon was asked
            raise Fallback("path:" + _report.errno_name(e), None, str(e)) from None
        raise Fallback("daemon-unavailable", None, str(e)) from None
    except Exception as e:  # a client failure (CUDA mapping, ...) is not the caller's
        raise Fallback("client-error:" + type(e).__name__, _socket_of(path), str(e)) from None
    _remember(os.path.dirname(path), lease.is_gpu)
    return lease


def _open(path, resident):
    """gdsfs.open(path) with ROOM_WAIT and identity (and resident); asked
    again without the fields an older daemon refuses (EINVAL naming the
    first it does not know): without identity where it names identity or
    resident (the socket remembered in _older), without any where it
    names room_wait_ms. A refused resident is raised: a lease without it
    could stage the file."""
    new = not _older or _socket_of(path) not in _older
    try:
        return gdsfs.open(path, room_wait=ROOM_WAIT, identity=new, resident=resident)
    except OSError as e:
        if not (getattr(e, "gdsfs_answer", False) and e.errno == _errno.EINVAL):
            raise
        msg = str(e)
        bare = 'unknown field "room_wait_ms"' in msg
        if new and (bare or 'unknown field "identity"' in msg or 'unknown field "resident"' in msg):
            sock = _socket_of(path)
            if sock is not None:
                _older.add(sock)
        elif not bare:
            raise
        if resident:
            raise
    return gdsfs.open(path) if bare else gdsfs.open(path, room_wait=ROOM_WAIT)


def socket_of(lease):
    """The socket to report a fallback of a leased file to."""
    return _socket_of(lease.path)


def element_size(torch, dtype):
    return torch.empty((), dtype=dtype).element_size()


def sync(torch, devices):
    """Wait for the copies queued on these CUDA devices: the lease they read
    from may be unmapped next."""
    for d in devices:
        torch.cuda.current_stream(d).synchronize()


def ustorage(t):
    """The untyped storage of tensor t (torch 1.13 and 2.x)."""
    if hasattr(t, "untyped_storage"):
        return t.untyped_storage()
    return t.storage().untyped()
