"""The lease socket protocol (proto/PROTOCOL.md): JSON lines; chunk
descriptors as SCM_RIGHTS on the answer's bytes (in groups of at most 253,
possibly over several recvmsg calls).
"""

import array
import collections
import errno as _errno
import json
import os
import socket
import struct
import threading

__all__ = ["Conn", "NotMountedError", "UntrustedDaemonError", "untrusted", "daemon_error", "wait_request", "wait_stat_request",
           "WAIT_STATES", "WAIT_STAT_KEYS", "MAX_WAIT_MS"]

PROTOCOL = 1  # the protocol version this client speaks (hello; proto/PROTOCOL.md)
MAX_FDS = 253  # the kernel's limit of descriptors in one SCM_RIGHTS message
# wait: the states a wait may end on (a file queued or loading reads as
# "loading", which is what a wait waits through; "failed: REASON" is failed).
WAIT_STATES = ("absent", "failed", "resident")
# wait_stat: the daemon's lease counters (its stats.json keys) one may wait
# on; ipc_open_connections leaves out the asking connection.
WAIT_STAT_KEYS = ("ipc_open_connections", "lease_held_bytes", "lease_held_files",
                  "lease_holding_connections", "leases_active")
MAX_WAIT_MS = 3600 * 1000  # the longest timeout_ms one wait may ask
_INT = array.array("i").itemsize
_CMSG_SPACE = socket.CMSG_SPACE(MAX_FDS * _INT)
_RECV_FLAGS = getattr(socket, "MSG_CMSG_CLOEXEC", 0)
_MAX_LINE = 16 << 20  # a sane bound on one answer line
# Seconds a connect may take (a listener that accepts nothing, its backlog
# full); a smaller timeout given to Conn bounds it too.
CONNECT_TIMEOUT = 10.0
_UCRED = struct.Struct("3i")  # SO_PEERCRED: pid, uid, gid

_untrusted = [0]
_untrusted_lock = threading.Lock()


class NotMountedError(OSError):
    """The path is not on a gdsfs mount (errno ENODEV)."""


class UntrustedDaemonError(PermissionError):
    """The lease socket's listener is not the mount's owner (the uid its
    daemon runs as; root for a mount root made), or, where no mount names
    one, neither root nor this process's uid: nothing was sent to it
    (errno EPERM). Attributes: socket, peer_uid, owner."""

    def __init__(self, socket_path, peer_uid, owner):
        if owner is None:
            want = "root or this process's uid (%d)" % os.geteuid()
        else:
            want = "the mount's owner (uid %d)" % owner
        super().__init__(_errno.EPERM, "gdsfs socket %s: served by uid %d, not %s: refused, nothing was sent"
                         % (socket_path, peer_uid, want))
        self.socket, self.peer_uid, self.owner = socket_path, peer_uid, owner


def untrusted():
    """How many connections this process refused because of who listened."""
    with _untrusted_lock:
        return _untrusted[0]


def _check_peer(s, path, owner):
    """Refuse a listener other than owner (the mount's owner: its daemon
    runs as that uid), or, when owner is None, other than root or this
    process's euid, by the socket's SO_PEERCRED. Root is not taken for
    another uid's mount: a root listener there is the daemon of another
    mount (root's), which would lease the file of the same relative path
    in its own SOURCE."""
    _, uid, _ = _UCRED.unpack(s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    ok = uid == owner if owner is not None else uid in (0, os.geteuid())
    if not ok:
        with _untrusted_lock:
            _untrusted[0] += 1
        raise UntrustedDaemonError(path, uid, owner)


def check_chunks(fds, lens, size):
    """Validate a grant's chunks against its descriptors and the file size;
    return the chunks' total length."""
    if not fds or len(fds) != len(lens):
        raise ValueError("gdsfs: %d descriptors for %d chunks" % (len(fds), len(lens)))
    for i, n in enumerate(lens):
        if n <= 0:
            raise ValueError("gdsfs: chunk %d has length %d" % (i, n))
    total = sum(lens)
    if size < 0 or size > total:
        raise ValueError("gdsfs: size %d outside chunks of %d bytes" % (size, total))
    return total


def grant_fds(g):
    """How many descriptors ride with a grant (an answer or an item)."""
    if not g.get("ok", True) or g.get("reuse"):
        return 0
    return len(g.get("chunks") or [])


def answer_fds(resp):
    """How many descriptors ride with an answer."""
    if not resp.get("ok"):
        return 0
    return grant_fds(resp) + sum(grant_fds(it) for it in (resp.get("files") or []))


def daemon_error(resp, path):
    """The OSError for an {"ok":false} answer (or item): OSError picks the
    subclass from the errno (PermissionError for EACCES, FileNotFoundError
    for ENOENT, TimeoutError for ETIMEDOUT, ...)."""
    name = resp.get("errno") or "EIO"
    num = getattr(_errno, name, None)
    if not isinstance(num, int):
        num = _errno.EIO
    msg = "gdsfs: %s" % (resp.get("error") or name)
    err = OSError(num, msg) if path is None else OSError(num, msg, os.fspath(path))
    err.gdsfs_answer = True  # the daemon said so; not a broken connection
    return err


def check_names(req):
    """Refuse (EILSEQ, naming it) a request naming a path that is not
    UTF-8 (a str holding surrogate escapes, as os.fsdecode makes): JSON
    cannot carry it, and a daemon would read it as another name."""
    for p in [req.get("path")] + list(req.get("paths") or ()):
        if isinstance(p, str):
            try:
                p.encode("utf-8")
            except UnicodeEncodeError:
                raise OSError(_errno.EILSEQ, "gdsfs %s: the name is not UTF-8, which the lease protocol cannot carry"
                              % req.get("op", "?"), p) from None


def wait_ms(seconds):
    """timeout_ms for a timeout in seconds: 1 to MAX_WAIT_MS."""
    return min(max(int(round(seconds * 1000)), 1), MAX_WAIT_MS)


def room_wait_fields(seconds):
    """The acquire fields for a room_wait in seconds: {} for None (the
    daemon's ipc.acquire_timeout alone), else room_wait_ms, whole
    milliseconds from 1 to MAX_WAIT_MS."""
    if seconds is None:
        return {}
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds >= 0:
        raise ValueError("gdsfs: room_wait %r: want seconds, 0 or more, or None" % (seconds,))
    return {"room_wait_ms": wait_ms(seconds)}


def wait_request(path, until, ms):
    """A wait request: answered when path's state is one of until."""
    until = [until] if isinstance(until, str) else list(until)
    bad = [u for u in until if u not in WAIT_STATES]
    if not until or bad:
        raise ValueError("gdsfs: wait until %r: want some of %s" % (until, ", ".join(WAIT_STATES)))
    return {"op": "wait", "path": path, "until": until, "timeout_ms": ms}


def wait_stat_request(key, value, ms):
    """A wait_stat request: answered when the counter key equals value."""
    if key not in WAIT_STAT_KEYS:
        raise ValueError("gdsfs: wait_stat key %r: want one of %s" % (key, ", ".join(WAIT_STAT_KEYS)))
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError("gdsfs: wait_stat value %r: want an int, 0 or more" % (value,))
    return {"op": "wait_stat", "key": key, "value": value, "timeout_ms": ms}


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


def _unknown_op(raw):
    """Whether an answer line refuses its request's op as unknown."""
    try:
        resp = json.loads(raw.decode())
    except ValueError:
        return False
    return (isinstance(resp, dict) and not resp.get("ok") and resp.get("errno") == "EINVAL"
            and "unknown op" in str(resp.get("error", "")))


# Notices sent on a connection whose answers were not read yet, at most:
# past it their answers are read before the next is sent. Unread, a few
# hundred answers fill the socket's buffer, the daemon blocks writing them
# and stops reading, and the next notice could not be sent.
_MAX_UNANSWERED = 64
_NOTICE_TIMEOUT = 5.0  # seconds to read those answers

class Conn:
    """One connection to a daemon's lease socket. The daemon holds every
    file granted on it until it closes. Requests are answered in turn;
    releases and drops are sent without waiting (their answers are read
    before the next request).

    The listener must be owner (the mount's user_id; None: root or this
    process's euid), checked before anything is sent
    (UntrustedDaemonError). Connecting takes at most CONNECT_TIMEOUT (or
    timeout, if smaller); timeout then bounds each socket operation (None:
    none)."""

    def __init__(self, path, timeout=None, owner=None):
        self.path = path
        self.pid = os.getpid()
        self.epoch = None
        self._buf = b""
        self._pending = collections.deque()  # ops of the releases and drops whose answers are not read yet
        self.no_drop = False  # the daemon does not know drop
        self._queued = collections.deque()  # releases and drops made while the connection was busy, in order
        self._lock = threading.Lock()
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # close-on-exec
        try:
            s.settimeout(CONNECT_TIMEOUT if timeout is None else min(timeout, CONNECT_TIMEOUT))
            s.connect(path)
            s.settimeout(timeout)
        except OSError as e:
            s.close()
            if isinstance(e, socket.timeout) and e.errno is None:
                raise TimeoutError(_errno.ETIMEDOUT, "gdsfs socket %s: connect timed out" % path) from None
            raise _wrap(e, "gdsfs socket %s" % path) from None
        try:
            _check_peer(s, path, owner)
        except BaseException:
            s.close()
            raise
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
        returned, not raised; a broken connection raises ConnectionError (or
        the socket's own OSError). Descriptors the kernel dropped
        (MSG_CTRUNC), or a count other than the answer announces, close the
        connection (ending what it granted) and raise. Releases and drops
        queued while the connection was busy go first."""
        try:
            return self._roundtrip(req)
        finally:
            self._flush_if_free()

    def _roundtrip(self, req):
        check_names(req)
        line = (json.dumps(req, separators=(",", ":")) + "\n").encode()
        op = req.get("op", "?")
        with self._lock:
            s = self._sock
            if s is None:
                raise ConnectionError(_errno.ENOTCONN, "gdsfs %s: connection closed" % op)
            try:
                self._send_queued_locked()
                self._drain(op)
            except BaseException:
                self.close()
                raise
            try:
                s.sendall(line)
            except OSError as e:
                # The daemon may have answered and hung up before reading
                # (too many connections): its answer says more than EPIPE.
                resp = self._answer_left()
                self.close()
                if resp is not None:
                    return resp, []
                raise _wrap(e, "gdsfs %s: sending to %s" % (op, self.path)) from None
            try:
                raw, fds, truncated = self._read_line(op)
            except BaseException:
                self.close()
                raise
            try:
                resp = json.loads(raw.decode())
                if not isinstance(resp, dict):
                    raise ValueError("not an object")
            except ValueError as e:
                _close_fds(fds)
                self.close()
                raise OSError(_errno.EPROTO, "gdsfs %s: bad answer %r: %s" % (op, raw[:200], e)) from None
            if truncated:
                _close_fds(fds)
                self.close()
                raise OSError(
                    _errno.EMFILE,
                    "gdsfs %s: the kernel dropped descriptors sent with the answer (MSG_CTRUNC; is "
                    "RLIMIT_NOFILE exhausted?); the connection was closed, which ends the lease" % op,
                )
            want = answer_fds(resp)
            if len(fds) != want:
                _close_fds(fds)
                self.close()
                raise OSError(_errno.EPROTO, "gdsfs %s: %d descriptors for %d chunks" % (op, len(fds), want))
        if resp.get("epoch") is not None:
            self.epoch = resp.get("epoch")
        return resp, fds

    def _read_line(self, op):
        """The next answer line, its descriptors, and whether MSG_CTRUNC was
        seen. Descriptors are received close-on-exec."""
        s = self._sock
        fds = []
        truncated = False
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
                    truncated = True  # read on to the line's end: the stream stays in step
                if not data:
                    raise ConnectionResetError(
                        _errno.ECONNRESET, "gdsfs %s: the daemon at %s closed the connection" % (op, self.path)
                    )
                self._buf += data
                if len(self._buf) > _MAX_LINE:
                    raise OSError(_errno.EPROTO, "gdsfs %s: answer line too long" % op)
        except BaseException:
            _close_fds(fds)
            raise
        raw, _, self._buf = self._buf.partition(b"\n")
        return raw, fds, truncated

    def _drain(self, op):
        """Read the answers of releases and drops sent earlier. A drop
        answered as an unknown op (a daemon older than drop) marks the
        connection no_drop: what it was granted stays held until it
        closes."""
        while self._pending:
            raw, fds, _ = self._read_line(op)
            _close_fds(fds)
            if self._pending.popleft() == "drop" and _unknown_op(raw):
                self.no_drop = True

    def release(self, lease, epoch):
        """End a lease id without waiting for its answer (with the
        connection busy, whoever holds it sends it when done; see
        _notice)."""
        self._notice({"op": "release", "lease": lease, "epoch": epoch})

    def drop(self, generation, device):
        """Stop the daemon holding a generation on a device that this
        connection was granted and this process unmapped, without waiting
        for the daemon (as release)."""
        if not self.no_drop:
            self._notice({"op": "drop", "generation": generation, "device": device})

    def _notice(self, req):
        """Send req (a release or drop) without waiting for its answer, in
        the order notices were made: now if the connection is free, else
        queued, and sent by whoever holds the connection when it is done
        with it (never by a thread of its own). Their answers are read
        before the next request, or before the next notice once
        _MAX_UNANSWERED are unread."""
        self._queued.append(req)
        self._flush_if_free()

    def _flush_if_free(self):
        while self._queued:
            if not self._lock.acquire(blocking=False):
                return  # the holder sends them once done (roundtrip)
            try:
                self._send_queued_locked()
            finally:
                self._lock.release()

    def _send_queued_locked(self):
        while self._queued:
            self._notice_locked(self._queued.popleft())

    def _notice_locked(self, req):
        s = self._sock
        if s is None:
            return  # closing ended it
        line = (json.dumps(req, separators=(",", ":")) + "\n").encode()
        try:
            if len(self._pending) >= _MAX_UNANSWERED:
                was = s.gettimeout()
                s.settimeout(_NOTICE_TIMEOUT)
                try:
                    self._drain(req["op"])
                finally:
                    s.settimeout(was)
            n = s.send(line, socket.MSG_DONTWAIT)
            if n != len(line):
                raise BlockingIOError(_errno.EAGAIN, "short write")
        except OSError:
            self.close()  # closing ends the lease (and the hold) as well
            return
        self._pending.append(req["op"])

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
