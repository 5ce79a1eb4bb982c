"""The lease socket protocol: JSON lines; chunk descriptors as SCM_RIGHTS.

One request line, one answer line; the descriptors of an acquire answer
ride on the answer's first bytes (they may arrive with the first of several
recvmsg calls).
"""

import array
import errno as _errno
import json
import os
import socket
import threading

__all__ = ["Conn", "NotMountedError", "daemon_error"]

MAX_FDS = 253  # the kernel's limit of descriptors in one SCM_RIGHTS message
_INT = array.array("i").itemsize
_CMSG_SPACE = socket.CMSG_SPACE(MAX_FDS * _INT)
_RECV_FLAGS = getattr(socket, "MSG_CMSG_CLOEXEC", 0)
_MAX_LINE = 16 << 20  # a sane bound on one answer line


class NotMountedError(OSError):
    """The path is not on a gdsfs mount (errno ENODEV)."""


def check_chunks(fds, lens, size):
    """Validate an acquire answer's chunks against its descriptors and the
    file size; return the chunks' total length."""
    if not fds or len(fds) != len(lens):
        raise ValueError("gdsfs: %d descriptors for %d chunks" % (len(fds), len(lens)))
    for i, n in enumerate(lens):
        if n <= 0:
            raise ValueError("gdsfs: chunk %d has length %d" % (i, n))
    total = sum(lens)
    if size < 0 or size > total:
        raise ValueError("gdsfs: size %d outside chunks of %d bytes" % (size, total))
    return total


def daemon_error(resp, path):
    """The OSError for an {"ok":false} answer: OSError picks the subclass
    from the errno (PermissionError for EACCES, FileNotFoundError for ENOENT,
    TimeoutError for ETIMEDOUT, ...)."""
    name = resp.get("errno") or "EIO"
    num = getattr(_errno, name, None)
    if not isinstance(num, int):
        num = _errno.EIO
    msg = "gdsfs: %s" % (resp.get("error") or name)
    err = OSError(num, msg) if path is None else OSError(num, msg, os.fspath(path))
    err.gdsfs_answer = True  # the daemon said so; not a broken connection
    return err


def _wrap(e, what):
    """e with `what` in its message, keeping its class (and errno)."""
    if e.errno is not None:
        n = OSError(e.errno, "%s: %s" % (what, e.strerror or e))
    else:
        try:
            n = type(e)("%s: %s" % (what, e))
        except Exception:
            n = OSError("%s: %s" % (what, e))
    return n


def _close_fds(fds):
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


class Conn:
    """One connection to a daemon's lease socket. The daemon ends every
    lease of a connection when it closes. Requests are answered in turn."""

    def __init__(self, path, timeout=None):
        self.path = path
        self.pid = os.getpid()
        self.epoch = None
        self._buf = b""
        self._lock = threading.Lock()
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # close-on-exec
        try:
            s.settimeout(timeout)
            s.connect(path)
        except OSError as e:
            s.close()
            raise _wrap(e, "gdsfs socket %s" % path) from None
        self._sock = s

    def close(self):
        s, self._sock = self._sock, None
        if s is not None:
            s.close()

    @property
    def closed(self):
        return self._sock is None

    def roundtrip(self, req):
        """Send req and return (answer dict, descriptors). Error answers are
        returned, not raised; a broken connection raises ConnectionError
        (or the socket's own OSError)."""
        line = (json.dumps(req, separators=(",", ":")) + "\n").encode()
        op = req.get("op", "?")
        with self._lock:
            s = self._sock
            if s is None:
                raise ConnectionError(_errno.ENOTCONN, "gdsfs %s: connection closed" % op)
            try:
                s.sendall(line)
            except OSError as e:
                # The daemon may have answered and hung up before reading
                # (too many connections): its answer says more than EPIPE.
                resp = self._answer_left()
                if resp is not None:
                    return resp, []
                raise _wrap(e, "gdsfs %s: sending to %s" % (op, self.path)) from None
            fds = []
            try:
                while b"\n" not in self._buf:
                    try:
                        data, anc, flags, _ = s.recvmsg(65536, _CMSG_SPACE, _RECV_FLAGS)
                    except OSError as e:
                        raise _wrap(e, "gdsfs %s: reading from %s" % (op, self.path)) from None
                    for level, kind, cdata in anc:
                        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                            a = array.array("i")
                            a.frombytes(cdata[: len(cdata) - len(cdata) % _INT])
                            for fd in a:
                                if not _RECV_FLAGS:
                                    os.set_inheritable(fd, False)
                                fds.append(fd)
                    if flags & socket.MSG_CTRUNC:
                        raise OSError(
                            _errno.EMFILE,
                            "gdsfs %s: the kernel dropped descriptors sent with the answer "
                            "(MSG_CTRUNC; is RLIMIT_NOFILE exhausted?)" % op,
                        )
                    if not data:
                        raise ConnectionResetError(
                            _errno.ECONNRESET,
                            "gdsfs %s: the daemon at %s closed the connection" % (op, self.path),
                        )
                    self._buf += data
                    if len(self._buf) > _MAX_LINE:
                        raise OSError(_errno.EPROTO, "gdsfs %s: answer line too long" % op)
                raw, _, self._buf = self._buf.partition(b"\n")
                try:
                    resp = json.loads(raw.decode())
                    if not isinstance(resp, dict):
                        raise ValueError("not an object")
                except ValueError as e:
                    raise OSError(_errno.EPROTO, "gdsfs %s: bad answer %r: %s" % (op, raw[:200], e)) from None
            except BaseException:
                _close_fds(fds)
                raise
        if resp.get("epoch") is not None:
            self.epoch = resp.get("epoch")
        if not resp.get("ok"):
            _close_fds(fds)
            fds = []
        return resp, fds

    def _answer_left(self):
        """An error answer already waiting on a socket the peer closed."""
        buf = self._buf
        try:
            while b"\n" not in buf:
                d = self._sock.recv(65536, socket.MSG_DONTWAIT)
                if not d:
                    break
                buf += d
        except OSError:
            pass
        raw, nl, _ = buf.partition(b"\n")
        if not nl:
            return None
        try:
            resp = json.loads(raw.decode())
        except ValueError:
            return None
        return resp if isinstance(resp, dict) and not resp.get("ok") else None

    def request(self, req, path=None):
        """roundtrip, raising the daemon's error answers as OSError."""
        resp, fds = self.roundtrip(req)
        if not resp.get("ok"):
            raise daemon_error(resp, path)
        return resp, fds
