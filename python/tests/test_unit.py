"""Client tests that need no mount: the protocol against a scripted fake
daemon (answers split across reads, memfds as SCM_RIGHTS), error mapping,
mountinfo parsing and mount lookup, shape/offset validation."""

import array
import errno
import json
import os
import socket
import subprocess
import threading
import time
import unittest
from unittest import mock

import _support  # noqa: F401 (puts python/ on sys.path)
from _golden import fake_mount, golden

import gdsfs
from gdsfs import _lease, _mount
from gdsfs._cuda import format_uuid


def memfd(data, size):
    fd = os.memfd_create("gdsfs-test", os.MFD_CLOEXEC)
    os.ftruncate(fd, size)
    os.pwrite(fd, data, 0)
    return fd


class FakeDaemon:
    """Serves connections one after another; handler(request dict) returns a
    list of actions: ("send", bytes, fds), ("sleep", s), ("wait", event),
    ("close",). Each connection's thread is joined by close()."""

    def __init__(self, handler, on_accept=(), conns=1):
        self.on_accept = list(on_accept)
        self.dir = _support.tmpdir()
        self.path = os.path.join(self.dir, "fake.sock")
        self.handler = handler
        self.requests = []
        self.eof = threading.Event()  # the client closed a connection
        self.ls = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.ls.bind(self.path)
        self.ls.listen(4)
        self.thread = threading.Thread(target=self._serve, args=(conns,), daemon=True)
        self.thread.start()

    def _serve(self, conns):
        for _ in range(conns):
            try:
                c, _ = self.ls.accept()
            except OSError:
                return
            with c:
                if self._conn(c):
                    return

    def _conn(self, c):
        for act in self.on_accept:
            if self._act(c, act):
                return True
        buf = b""
        while True:
            while b"\n" not in buf:
                try:
                    d = c.recv(4096)
                except OSError:
                    d = b""
                if not d:
                    self.eof.set()
                    return False
                buf += d
            line, _, buf = buf.partition(b"\n")
            req = json.loads(line)
            self.requests.append(req)
            for act in self.handler(req):
                if self._act(c, act):
                    return True

    def _act(self, c, act):
        if act[0] == "send":
            _, data, fds = act
            try:
                if fds:
                    c.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
                else:
                    c.sendall(data)
            except OSError:
                pass  # the client went away (it never waits for a release's answer)
        elif act[0] == "sleep":
            time.sleep(act[1])
        elif act[0] == "wait":
            act[1].wait(30)
        elif act[0] == "close":
            return True
        return False

    def wait(self):
        """Wait for the connections' thread, which ends when the client has
        closed its side of each; False if it did not within 10s."""
        self.thread.join(10)
        return not self.thread.is_alive()

    def close(self):
        alive = not self.wait()
        self.ls.close()
        self.thread.join(10)
        return not alive


def answer(d):
    return (json.dumps(d) + "\n").encode()


def split(data, fds, pieces=(1, 1, 3, 10)):
    """Actions sending data in small pieces, fds with the first."""
    acts, i = [], 0
    for n in pieces:
        acts += [("send", data[i : i + n], fds if i == 0 else None), ("sleep", 0.01)]
        i += n
    return acts + [("send", data[i:], None)]


def client_fds():
    """The descriptors a client could leak: memfds and sockets, by number
    and what they are."""
    out = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink("/proc/self/fd/" + fd)
        except OSError:
            continue  # the listing's own descriptor
        if link.startswith("/memfd:") or link.startswith("socket:"):
            out.add((int(fd), link))
    return out


def new_fds(before):
    """Memfds and sockets open now that were not before. Only new ones
    count: threads of earlier tests may still be closing theirs, so the
    whole table may shrink meanwhile; it must not grow."""
    return sorted(client_fds() - before)


ACQ = {"ok": True, "epoch": 7, "lease": 3, "generation": 1, "device": "host", "sharing": "shared"}


def fake_root_mount(tc):
    """Make "/" a gdsfs mount of this process's euid to the client for the
    test (paths are sent relative to it); return the mountinfo file."""
    path = fake_mount("/")
    old, _mount.MOUNTINFO = _mount.MOUNTINFO, path
    tc.addCleanup(setattr, _mount, "MOUNTINFO", old)
    return path


class ProtocolTests(unittest.TestCase):
    def setUp(self):
        self.mountinfo = fake_root_mount(self)

    def fake(self, handler, on_accept=(), conns=1):
        f = FakeDaemon(handler, on_accept, conns)
        self.addCleanup(f.close)
        self.addCleanup(gdsfs.disconnect)  # runs first: kept mappings
        return f

    def test_split_answer_with_fds(self):
        a, b = os.urandom(4096), os.urandom(904)
        fds = [memfd(a, 4096), memfd(b, 4096)]
        self.addCleanup(lambda: [os.close(fd) for fd in fds])

        def handler(req):
            if req["op"] == "acquire":
                return split(answer(dict(ACQ, size=5000, chunks=[{"len": 4096}, {"len": 4096}])), fds)
            return [("send", answer({"ok": True, "epoch": 7}), None)]

        f = self.fake(handler)
        before = client_fds()
        lease = gdsfs.open("/some/where/file.bin", socket=f.path)
        self.assertEqual(f.requests[0], {"op": "acquire", "path": "some/where/file.bin"})
        self.assertEqual((lease.size, lease.id, lease.epoch, lease.device, lease.chunks), (5000, 3, 7, "host", (4096, 4096)))
        self.assertTrue(lease.readonly)
        self.assertEqual(bytes(lease.memoryview()), a + b)
        self.assertEqual(lease.read(4000, 200), (a + b)[4000:4200])
        lease.close()
        self.assertTrue(lease.released)
        # Not to be kept ("cache" absent): unmapped, and the connection
        # closed, which is the release.
        self.assertTrue(f.wait(), "the client kept its connection")
        self.assertEqual(len(f.requests), 1, f.requests)
        self.assertEqual(new_fds(before), [], "received descriptors and the socket must be closed")

    def test_name_not_utf8_is_refused_before_sending(self):
        """A path that is not UTF-8 (surrogate escapes from os.fsdecode)
        is refused with EILSEQ naming it; nothing reaches the daemon,
        which would read the escaped bytes as U+FFFD, another name."""
        f = self.fake(lambda req: [("send", answer({"ok": True, "epoch": 7}), None)])
        bad = os.fsdecode(b"/some/where/m-\xff.bin")
        for call in (lambda: gdsfs.open(bad, socket=f.path), lambda: gdsfs.open_many(["/some/where/a.bin", bad], socket=f.path)):
            with self.assertRaises(OSError) as cm:
                call()
            self.assertEqual(cm.exception.errno, errno.EILSEQ, cm.exception)
            self.assertIn("m-\\udcff.bin", str(cm.exception))
        self.assertEqual(f.requests, [])

    def test_room_wait_is_sent(self):
        """room_wait (seconds) goes as room_wait_ms on acquire and
        acquire_many; a bad one is refused before anything is sent."""
        refused = {"ok": False, "epoch": 7, "errno": "ENOSPC", "error": "no room"}

        def handler(req):
            if req["op"] == "acquire_many":
                return [("send", answer({"ok": True, "epoch": 7, "files": [refused]}), None)]
            return [("send", answer(refused), None)]

        f = self.fake(handler, conns=2)
        with self.assertRaises(OSError) as cm:
            gdsfs.open("/a/b", socket=f.path, room_wait=0.25)
        self.assertEqual(cm.exception.errno, errno.ENOSPC)
        with self.assertRaises(OSError) as cm:
            gdsfs.open_many(["/a/c"], socket=f.path, room_wait=0.0001)
        self.assertEqual(cm.exception.errno, errno.ENOSPC)
        self.assertEqual([(r["op"], r.get("room_wait_ms")) for r in f.requests], [("acquire", 250), ("acquire_many", 1)])
        for bad in (-1, "1", float("nan")):
            with self.assertRaises(ValueError):
                gdsfs.open("/a/b", socket=f.path, room_wait=bad)
        self.assertEqual(len(f.requests), 2)

    def test_autoload_room_wait_with_a_daemon_without_it(self):
        """A daemon that refuses room_wait_ms (EINVAL naming it) is asked
        again without it: the autoloader's loads are not all refused."""
        from gdsfs.autoload import _serve

        def handler(req):
            if "room_wait_ms" in req:
                return [("send", answer({"ok": False, "epoch": 7, "errno": "EINVAL",
                                         "error": 'malformed request: json: unknown field "room_wait_ms"'}), None)]
            return [("send", answer({"ok": False, "epoch": 7, "errno": "ENOSPC", "error": "no room"}), None)]

        f = self.fake(handler, conns=2)
        old = os.environ.get("GDSFS_SOCKET")
        os.environ["GDSFS_SOCKET"] = f.path
        try:
            with self.assertRaises(_serve.Fallback) as cm:
                _serve.acquire("/a/b")
        finally:
            if old is None:
                del os.environ["GDSFS_SOCKET"]
            else:
                os.environ["GDSFS_SOCKET"] = old
        self.assertEqual(cm.exception.reason, "refused:ENOSPC")
        self.assertEqual([r.get("room_wait_ms") for r in f.requests], [100, None])

    def test_lease_identity_is_read_from_the_grant(self):
        """resident and identity go on the acquire when asked; the grant's
        identity is the lease's, as (ino, size, mtime_ns, ctime_ns); one
        that is malformed or absent is None (the caller checks otherwise)."""
        fd = memfd(b"hello", 4096)
        self.addCleanup(os.close, fd)
        ident = {"ino": 12, "size": 5, "mtime_ns": 34, "ctime_ns": 56}
        grants = [dict(ident), dict(ident, ino="12"), None]

        def handler(req):
            g = dict(ACQ, size=5, chunks=[{"len": 4096}])
            i = grants.pop(0)
            if i is not None:
                g["identity"] = i
            return [("send", answer(g), [fd])]

        f = self.fake(handler, conns=3)
        got = []
        for kw in ({"identity": True, "resident": True}, {"identity": True}, {}):
            with gdsfs.open("/a/b", socket=f.path, **kw) as lease:
                got.append(lease.identity)
            gdsfs.disconnect()
        self.assertEqual(got, [(12, 5, 34, 56), None, None])
        self.assertEqual([(r.get("identity"), r.get("resident")) for r in f.requests],
                         [(True, True), (True, None), (None, None)])

    def test_autoload_identity_and_resident_with_a_daemon_without_them(self):
        """A daemon that refuses identity (EINVAL naming it) is asked again
        without it; one that refuses resident is not asked again without
        it (that lease could stage the file): its refusal is the
        fallback's reason."""
        from gdsfs.autoload import _serve

        def handler(req):
            for k in ("identity", "resident"):
                if k in req:
                    return [("send", answer({"ok": False, "epoch": 7, "errno": "EINVAL",
                                             "error": 'malformed request: json: unknown field "%s"' % k}), None)]
            return [("send", answer({"ok": False, "epoch": 7, "errno": "ENOSPC", "error": "no room"}), None)]

        f = self.fake(handler, conns=4)
        old = os.environ.get("GDSFS_SOCKET")
        os.environ["GDSFS_SOCKET"] = f.path
        self.addCleanup(_serve._older.clear)
        try:
            with self.assertRaises(_serve.Fallback) as cm:
                _serve.acquire("/a/b")
            self.assertEqual(cm.exception.reason, "refused:ENOSPC")
            _serve._older.clear()
            with self.assertRaises(_serve.Fallback) as cm:
                _serve.acquire("/a/b", resident=True)
            self.assertEqual(cm.exception.reason, "refused:EINVAL")
        finally:
            if old is None:
                del os.environ["GDSFS_SOCKET"]
            else:
                os.environ["GDSFS_SOCKET"] = old
        self.assertEqual([(r.get("identity"), r.get("resident"), r.get("room_wait_ms")) for r in f.requests],
                         [(True, None, 100), (None, None, 100), (True, True, 100)])

    def test_kept_mapping_and_release_never_waits(self):
        fd = memfd(b"hello", 4096)
        self.addCleanup(os.close, fd)
        gate = threading.Event()

        def handler(req):
            if req["op"] == "acquire" and "generation" not in req:
                return [("send", answer(dict(ACQ, size=5, chunks=[{"len": 4096}], cache=True)), [fd])]
            if req["op"] == "release":
                return [("wait", gate), ("send", answer({"ok": True, "epoch": 7}), None)]
            return [("send", answer(dict(ACQ, lease=req.get("generation", 0) + 10, size=5, cache=True, reuse=True)), None)]

        f = self.fake(handler)
        lease = gdsfs.open("/a/b", socket=f.path)
        ptr = lease.ptr
        done = threading.Event()
        threading.Thread(target=lambda: (lease.close(), done.set()), daemon=True).start()
        self.assertTrue(done.wait(10), "close() waited for the daemon's answer to the release")
        self.assertFalse(gate.is_set())
        gate.set()
        again = gdsfs.open("/a/b", socket=f.path)  # reads the release's answer, then this one's
        self.assertTrue(again.reused)
        self.assertEqual((again.ptr, again.id, again.read()), (ptr, 11, b"hello"))
        self.assertEqual([r["op"] for r in f.requests], ["acquire", "release", "acquire"])
        self.assertEqual(f.requests[2], {"op": "acquire", "path": "a/b", "generation": 1})
        again.close()
        gdsfs.disconnect()
        self.assertTrue(f.wait())

    def test_error_answers(self):
        cases = [("EACCES", PermissionError, errno.EACCES), ("ENOENT", FileNotFoundError, errno.ENOENT),
                 ("ETIMEDOUT", TimeoutError, errno.ETIMEDOUT), ("EMFILE", OSError, errno.EMFILE),
                 ("EISDIR", IsADirectoryError, errno.EISDIR), ("EBOGUS", OSError, errno.EIO)]
        for name, cls, num in cases:
            with self.subTest(errno=name):
                f = self.fake(lambda req, n=name: split(answer({"ok": False, "epoch": 1, "errno": n, "error": "x: nope"}), None))
                with self.assertRaises(cls) as cm:
                    gdsfs.open("/a/b", socket=f.path)
                self.assertEqual(cm.exception.errno, num)
                self.assertEqual(cm.exception.filename, "/a/b")
                self.assertIn("x: nope", str(cm.exception))
                self.assertTrue(f.wait(), "the failed lease's connection stayed open")

    def test_fd_count_mismatch(self):
        fd = memfd(b"x", 4096)
        self.addCleanup(os.close, fd)

        def handler(req):
            return [("send", answer(dict(ACQ, size=5000, chunks=[{"len": 4096}, {"len": 4096}])), [fd])]

        f = self.fake(handler)
        before = client_fds()
        with self.assertRaises(OSError) as cm:
            gdsfs.open("/a/b", socket=f.path)
        self.assertEqual(cm.exception.errno, errno.EPROTO)
        self.assertTrue(f.wait(), "the connection of a broken answer must be closed (ending its lease)")
        self.assertEqual(new_fds(before), [])

    def test_daemon_gone_before_close(self):
        fd = memfd(b"hello", 4096)
        self.addCleanup(os.close, fd)
        f = self.fake(lambda req: [("send", answer(dict(ACQ, size=5, chunks=[{"len": 4096}], cache=True)), [fd]), ("close",)])
        lease = gdsfs.open("/a/b", socket=f.path)
        self.assertEqual(lease.read(), b"hello")
        f.close()
        lease.close()  # no error: the lease ended with its daemon
        self.assertTrue(lease.released)

    def test_refused_before_request(self):
        # ipc.max_connections: the daemon answers at once and hangs up.
        f = self.fake(None, on_accept=[("send", answer({"ok": False, "errno": "EMFILE", "error": "more than ipc.max_connections (256) clients"}), None), ("close",)])
        with self.assertRaises(OSError) as cm:
            gdsfs.open("/a/b", socket=f.path)
        self.assertEqual(cm.exception.errno, errno.EMFILE)
        self.assertIn("max_connections", str(cm.exception))

    def test_closed_mid_answer(self):
        f = self.fake(lambda req: [("send", b'{"ok":tr', None), ("close",)])
        with self.assertRaises(ConnectionError):
            gdsfs.open("/a/b", socket=f.path)

    def test_bad_answer(self):
        f = self.fake(lambda req: [("send", b"not json\n", None)])
        with self.assertRaises(OSError) as cm:
            gdsfs.open("/a/b", socket=f.path)
        self.assertEqual(cm.exception.errno, errno.EPROTO)

    def test_zero_size(self):
        fd = memfd(b"", 4096)
        self.addCleanup(os.close, fd)
        # The daemon omits "size" for an empty file and still sends a chunk.
        f = self.fake(lambda req: [("send", answer(dict(ACQ, chunks=[{"len": 4096}])), [fd])])
        with gdsfs.open("/a/b", socket=f.path) as lease:
            self.assertEqual(lease.size, 0)
            self.assertEqual(bytes(lease.memoryview()), b"")
            self.assertEqual(lease.read(), b"")

    def test_no_socket(self):
        d = _support.tmpdir()
        with self.assertRaises(FileNotFoundError) as cm:
            gdsfs.open("/a/b", socket=os.path.join(d, "none.sock"))
        self.assertIn("gdsfs socket", str(cm.exception))

    def test_stat(self):
        f = self.fake(lambda req: [("send", answer({"ok": True, "epoch": 2, "size": 9, "state": "resident",
                                                    "load_path": "host"}), None)])
        st = gdsfs.stat("/x/y", socket=f.path)
        self.assertEqual(f.requests, [{"op": "stat", "path": "x/y"}])
        self.assertEqual((st["size"], st["state"], st["load_path"]), (9, "resident", "host"))

    def test_truncated_descriptors_end_the_lease(self):
        """MSG_CTRUNC (no room for the descriptors under RLIMIT_NOFILE): the
        client raises EMFILE and closes the connection, ending the lease,
        while it goes on running."""
        fds = [memfd(b"x" * 4096, 4096) for _ in range(6)]
        self.addCleanup(lambda: [os.close(fd) for fd in fds])
        f = self.fake(lambda req: [("send", answer(dict(ACQ, size=6 * 4096, chunks=[{"len": 4096}] * 6)), fds)])
        script = r"""
import errno, os, resource, sys, gdsfs
os.pipe()  # nothing lazy left to open
highest = max(int(x) for x in os.listdir("/proc/self/fd"))
while True:  # fill the free numbers below the highest open descriptor
    fd = os.open("/dev/null", os.O_RDONLY)
    if fd > highest:
        os.close(fd)
        break
resource.setrlimit(resource.RLIMIT_NOFILE, (highest + 3, highest + 3))  # the socket and one chunk
gdsfs._mount.MOUNTINFO = sys.argv[2]
try:
    gdsfs.open("/a/b", socket=sys.argv[1])
    print("leased", flush=True)
except OSError as e:
    print(errno.errorcode.get(e.errno), "MSG_CTRUNC" in str(e), flush=True)
sys.stdin.read()
"""
        proc = _support.child(script, [f.path, self.mountinfo], stdin=subprocess.PIPE)
        try:
            line = proc.stdout.readline().decode()
            self.assertEqual(line.split(), ["EMFILE", "True"], proc.stderr.read1(4096) if not line else line)
            self.assertTrue(f.eof.wait(10), "the client kept the connection (and the lease) open")
            self.assertIsNone(proc.poll(), "the client was to stay alive")
        finally:
            proc.stdin.close()
            proc.wait(30)
            proc.stdout.close()
            proc.stderr.close()


_PLANTED = r"""
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.bind(sys.argv[1])
s.listen(8)
print("ready", flush=True)
sys.stdin.readline()
s.settimeout(0)
got = []
try:
    while True:
        c, _ = s.accept()
        c.settimeout(None)
        n = 0
        while True:
            d = c.recv(4096)
            if not d:
                break
            n += len(d)
        got.append(str(n))
except BlockingIOError:
    pass
print("got", " ".join(got), flush=True)
"""


_HELLO = r"""
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.bind(sys.argv[1])
s.listen(8)
print("ready", flush=True)
c, _ = s.accept()
f = c.makefile("rb")
f.readline()
c.sendall(b'{"ok": true, "version": 1, "devices": ["GPU-00000000-0000-0000-0000-000000000001"]}\n')
f.close()
c.close()
"""


class NoticeOrderTests(unittest.TestCase):
    def test_notices_made_while_busy_go_in_order_before_the_next_request(self):
        """Releases and drops made while another thread's request holds the
        connection are queued, not sent by threads of their own (which
        could reorder them), and go out in the order they were made, ahead
        of the next request."""
        d = FakeDaemon(lambda req: [("send", answer({"ok": True, "epoch": 1}), [])])
        self.addCleanup(d.close)
        conn = gdsfs._proto.Conn(d.path)
        self.addCleanup(conn.close)
        threads = threading.active_count()
        with conn._lock:  # busy with another request
            conn.release(7, 1)
            conn.drop(3, "host")
            conn.release(8, 1)
            self.assertEqual(threading.active_count(), threads, "a notice started a thread")
        conn.request({"op": "hello", "version": 1})
        conn.close()
        self.assertTrue(d.wait())
        self.assertEqual([(r["op"], r.get("lease"), r.get("generation")) for r in d.requests],
                         [("release", 7, None), ("drop", None, 3), ("release", 8, None), ("hello", None, None)])


class ForkTests(unittest.TestCase):
    def test_a_child_forked_while_the_driver_is_looked_up_can_look_it_up(self):
        """The lease-ahead worker looks the CUDA driver up in the
        background (under _cuda._driver_lock); a child forked meanwhile (a
        DataLoader's worker) gets the lock free, not held by a thread it
        does not have."""
        from gdsfs import _cuda

        held, go = threading.Event(), threading.Event()

        def look_up():
            with _cuda._driver_lock:
                held.set()
                go.wait(120)
        th = threading.Thread(target=look_up)
        th.start()
        held.wait(120)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.write(w, b"1" if _cuda._driver_lock.locked() else b"0")
            os._exit(0)
        os.close(w)
        got = os.read(r, 1)
        os.close(r)
        os.waitpid(pid, 0)
        go.set()
        th.join()
        self.assertEqual(got, b"0", "the child's _driver_lock is held by a thread it does not have")


def _report_at_exit(w):
    """A multiprocessing worker's body: one fallback, its report written
    to w once the worker's exit has begun."""
    from multiprocessing import util

    from gdsfs.autoload import _report

    gate = threading.Event()

    def report(sock, reason, owner=None):
        gate.wait()
        os.write(w, reason.encode() + b"\n")

    _report._report = report
    util.Finalize(None, gate.set, exitpriority=100)  # runs first among the exit finalizers
    _report.fallback("torch.Tensor.to", "requires-grad", socket_path="/nonexistent/sock")


class TrustTests(unittest.TestCase):
    """Who listens on the lease socket, where paths go, and how long a
    connect may take."""

    def listener(self, d):
        """(path, socket) of a Unix socket listening at d/s.sock, closed
        when the test ends."""
        sock = os.path.join(d, "s.sock")
        ls = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.addCleanup(ls.close)
        ls.bind(sock)
        ls.listen(8)
        return sock, ls

    def report_listener(self, n):
        """(mnt, got, thread): mnt a mount of this process's uid whose
        socket answers n reports ok, their lines appended to got, by
        thread (started)."""
        d = os.path.realpath(_support.tmpdir())
        sock, ls = self.listener(d)
        mnt = os.path.join(d, "mnt")
        os.makedirs(os.path.join(mnt, "w"))
        self.mount_at(mnt, sock, owner=os.geteuid())
        got = []

        def serve():
            for _ in range(n):
                c, _ = ls.accept()
                with c:
                    got.append(c.makefile("rb").readline())
                    c.sendall(b'{"ok":true}\n')

        th = threading.Thread(target=serve, daemon=True)
        th.start()
        return mnt, got, th

    def mount_at(self, mnt, sock, owner=0):
        """Make mnt a gdsfs mount of owner to the client, .gdsfs/socket
        naming sock."""
        os.makedirs(os.path.join(mnt, ".gdsfs"), exist_ok=True)
        with open(os.path.join(mnt, ".gdsfs", "socket"), "w") as f:
            f.write(sock + "\n")
        path = os.path.join(_support.tmpdir(), "mountinfo")
        with open(path, "w") as f:
            f.write("22 1 8:1 / / rw - ext4 /dev/sda1 rw\n"
                    "40 22 0:99 / %s rw - fuse.gdsfs /src rw,user_id=%d,group_id=0\n" % (mnt, owner))
        old, _mount.MOUNTINFO = _mount.MOUNTINFO, path
        self.addCleanup(setattr, _mount, "MOUNTINFO", old)
        self.addCleanup(gdsfs.disconnect)

    def test_hello_to_the_daemon_of_another_users_mount(self):
        """The autoloader asks the daemon of a mount owned by uid 65534
        (its listener that uid) whether it stages onto a GPU: the mount's
        owner is trusted for its own mount."""
        if os.geteuid() != 0:
            self.skipTest(_support.loud("SKIPPED: a listener of uid 65534 needs root"))
        d = _support.tmpdir()
        os.chmod(d, 0o777)
        sock = os.path.join(d, "theirs.sock")
        proc = _support.child(_HELLO, [sock], uid=_support.NOBODY)
        self.addCleanup(proc.wait, 30)
        self.addCleanup(proc.stderr.close)
        self.addCleanup(proc.stdout.close)
        if proc.stdout.readline() != b"ready\n":
            self.fail("the daemon did not start: %s" % proc.stderr.read1(4096))
        mnt = os.path.realpath(os.path.join(d, "mnt"))
        self.mount_at(mnt, sock, owner=_support.NOBODY)
        from gdsfs.autoload import _serve

        self.assertIs(_serve.mount_is_gpu(os.path.join(mnt, "sub", "model.pt")), True)

    def test_planted_socket_refused(self):
        """A socket whose listener is uid 65534, not root (the mount's
        owner), gets nothing: open, open_many, stat and wait refuse it,
        counted, and the autoloader falls back for that reason."""
        if os.geteuid() != 0:
            self.skipTest(_support.loud("SKIPPED: planting a socket as uid 65534 needs root"))
        d = _support.tmpdir()
        os.chmod(d, 0o777)
        sock = os.path.join(d, "planted.sock")
        proc = _support.child(_PLANTED, [sock], uid=_support.NOBODY, stdin=subprocess.PIPE)
        self.addCleanup(proc.wait, 30)
        self.addCleanup(proc.stderr.close)
        self.addCleanup(proc.stdout.close)
        self.addCleanup(proc.stdin.close)
        if proc.stdout.readline() != b"ready\n":
            self.fail("the planted daemon did not start: %s" % proc.stderr.read1(4096))
        mnt = os.path.realpath(os.path.join(d, "mnt"))
        self.mount_at(mnt, sock)
        f = os.path.join(mnt, "model.pt")
        before = gdsfs.untrusted()
        calls = [("open", lambda: gdsfs.open(f)), ("open_many", lambda: gdsfs.open_many([f, f + "2"])),
                 ("stat", lambda: gdsfs.stat(f)), ("wait", lambda: gdsfs.wait(f, timeout=1))]
        for name, call in calls:
            with self.subTest(call=name):
                with self.assertRaises(gdsfs.UntrustedDaemonError) as cm:
                    call()
                e = cm.exception
                self.assertEqual((e.errno, e.peer_uid, e.owner), (errno.EPERM, _support.NOBODY, 0))
                self.assertIn(sock, str(e))
                self.assertIn("uid 65534", str(e))
        from gdsfs.autoload import _serve

        with self.assertRaises(_serve.Fallback) as cm:
            _serve.acquire(f)
        self.assertEqual(cm.exception.reason, "untrusted-daemon")
        self.assertEqual(gdsfs.untrusted() - before, 5)
        proc.stdin.write(b"report\n")
        proc.stdin.flush()
        self.assertEqual(proc.stdout.readline().split(), [b"got"] + [b"0"] * 5,
                         "the planted daemon was sent something")

    def test_root_listener_refused_for_another_users_mount(self):
        """A mount owned by uid 65534 (one that user made, fuse.gdsfs by
        its subtype) whose .gdsfs/socket names a socket root listens on
        (the daemon of root's own mount, which serves another SOURCE):
        nothing is sent to it. Its daemon runs as its owner; root's daemon
        would lease the file of the same relative path in its own SOURCE,
        bytes the plain read of the mount never shows."""
        if os.geteuid() != 0:
            self.skipTest(_support.loud("SKIPPED: a mount of uid 65534 served by root needs root"))
        d = _support.tmpdir()
        sock = os.path.join(d, "roots.sock")
        srv = socket.socket(socket.AF_UNIX)
        self.addCleanup(srv.close)
        srv.bind(sock)
        srv.listen(8)
        got = []

        def serve():  # reads each connection's first line, answers nothing
            while True:
                try:
                    c, _ = srv.accept()
                except OSError:
                    return
                with c:
                    got.append(c.makefile("rb").readline())

        t = threading.Thread(target=serve, daemon=True)
        t.start()
        mnt = os.path.realpath(os.path.join(d, "mnt"))
        self.mount_at(mnt, sock, owner=_support.NOBODY)
        f = os.path.join(mnt, "model.pt")
        with self.assertRaises(gdsfs.UntrustedDaemonError) as cm:
            gdsfs.open(f)
        e = cm.exception
        self.assertEqual((e.errno, e.peer_uid, e.owner), (errno.EPERM, 0, _support.NOBODY))
        from gdsfs.autoload import _serve

        with self.assertRaises(_serve.Fallback) as cm:
            _serve.acquire(f)
        self.assertEqual(cm.exception.reason, "untrusted-daemon")
        srv.shutdown(socket.SHUT_RDWR)
        t.join()
        self.assertEqual([x for x in got if x], [], "the root listener was sent something")

    def test_planted_socket_gets_no_report(self):
        """A fallback the autoloader counts before any lease (requires
        grad, a dtype conversion) is not reported to a socket whose
        listener is uid 65534, not the mount's owner: nothing is sent."""
        if os.geteuid() != 0:
            self.skipTest(_support.loud("SKIPPED: planting a socket as uid 65534 needs root"))
        d = _support.tmpdir()
        os.chmod(d, 0o777)
        sock = os.path.join(d, "planted.sock")
        proc = _support.child(_PLANTED, [sock], uid=_support.NOBODY, stdin=subprocess.PIPE)
        self.addCleanup(proc.wait, 30)
        self.addCleanup(proc.stderr.close)
        self.addCleanup(proc.stdout.close)
        self.addCleanup(proc.stdin.close)
        if proc.stdout.readline() != b"ready\n":
            self.fail("the planted daemon did not start: %s" % proc.stderr.read1(4096))
        mnt = os.path.realpath(os.path.join(d, "mnt"))
        self.mount_at(mnt, sock)
        from gdsfs.autoload import _report

        _report.reset()
        self.addCleanup(_report.reset)
        _report.fallback("torch.load", "requires-grad", os.path.join(mnt, "model.pt"))
        self.assertEqual(_report.fallbacks(), {"requires-grad": 1})
        self.assertTrue(_report.flush(60))  # the report was tried (and refused) before the daemon is asked
        proc.stdin.write(b"report\n")
        proc.stdin.flush()
        got = proc.stdout.readline().split()
        self.assertEqual(got[0], b"got")
        self.assertEqual([n for n in got[1:] if n != b"0"], [], "the planted daemon was sent a report")

    def test_a_fallback_does_not_wait_for_its_report(self):
        """The call that fell back returns while its daemon has not
        answered the report yet: a background thread sends it, and
        flush() waits for the answer."""
        from gdsfs.autoload import _report

        d = os.path.realpath(_support.tmpdir())
        sock, ls = self.listener(d)
        mnt = os.path.join(d, "mnt")
        os.makedirs(os.path.join(mnt, "w"))
        self.mount_at(mnt, sock, owner=os.geteuid())
        _report.reset()
        self.addCleanup(_report.reset)
        self.addCleanup(setattr, _report, "_REPORT_TIMEOUT", _report._REPORT_TIMEOUT)
        _report._REPORT_TIMEOUT = 300  # a call that waited for the answer would wait that long
        go, got = threading.Event(), []

        def serve():
            c, _ = ls.accept()
            with c:
                got.append(c.makefile("rb").readline())
                go.wait(120)
                c.sendall(b'{"ok":true}\n')

        th = threading.Thread(target=serve, daemon=True)
        th.start()
        call = threading.Thread(target=_report.fallback,
                                args=("torch.Tensor.to", "cpu-target-gpu-staged", os.path.join(mnt, "w", "f.pt")))
        call.start()
        call.join(60)
        returned = not call.is_alive()
        go.set()
        call.join(300)
        self.assertTrue(returned, "the fallback waited for the daemon's answer to its report")
        self.assertTrue(_report.flush(60))
        th.join(60)
        self.assertEqual(len(got), 1)
        self.assertIn(b'"cpu-target-gpu-staged"', got[0])

    def test_a_full_queue_of_reports_is_not_grown(self):
        """With MAX_QUEUED reports waiting, a fallback sends its own report
        (as it did before reports were queued): it waits for the daemon
        rather than queue without bound."""
        from gdsfs.autoload import _report

        _report.reset()
        self.addCleanup(_report.reset)
        for name, value in (("MAX_QUEUED", 0), ("_REPORT_TIMEOUT", 300)):
            self.addCleanup(setattr, _report, name, getattr(_report, name))
            setattr(_report, name, value)
        d = os.path.realpath(_support.tmpdir())
        sock, ls = self.listener(d)
        mnt = os.path.join(d, "mnt")
        os.makedirs(os.path.join(mnt, "w"))
        self.mount_at(mnt, sock, owner=os.geteuid())
        go = threading.Event()

        def serve():
            c, _ = ls.accept()
            with c:
                c.makefile("rb").readline()
                go.wait(120)
                c.sendall(b'{"ok":true}\n')

        threading.Thread(target=serve, daemon=True).start()
        call = threading.Thread(target=_report.fallback,
                                args=("torch.Tensor.to", "requires-grad", os.path.join(mnt, "w", "f.pt")))
        call.start()
        call.join(0.5)  # it cannot end before go: no answer comes until then
        waited = call.is_alive()
        go.set()
        call.join(120)
        self.assertTrue(waited, "the fallback queued its report beyond MAX_QUEUED")

    def test_reports_are_sent_before_the_process_exits(self):
        mnt, got, th = self.report_listener(5)
        script = ("import os, sys\n"
                  "from gdsfs import _mount\n"
                  "_mount.MOUNTINFO = sys.argv[1]\n"
                  "from gdsfs.autoload import _report\n"
                  "for i in range(5):\n"
                  "    _report.fallback('torch.load', 'requires-grad', os.path.join(sys.argv[2], 'w', 'f%d.pt' % i))\n")
        p = _support.child(script, [_mount.MOUNTINFO, mnt])
        out, err = p.communicate(timeout=120)
        self.assertEqual(p.returncode, 0, err)
        th.join(60)
        self.assertEqual(len(got), 5, err)

    def test_a_multiprocessing_worker_sends_its_queued_reports(self):
        """A worker started by multiprocessing (a DataLoader's) leaves by
        os._exit, which runs no atexit handler: its queued reports are
        sent at its exit all the same. The worker's sender is held until
        its exit has begun (a finalizer that runs before the others)."""
        import multiprocessing

        r, w = os.pipe()
        p = multiprocessing.get_context("fork").Process(target=_report_at_exit, args=(w,))
        p.start()
        os.close(w)
        p.join(120)
        with os.fdopen(r, "rb") as f:
            got = f.read()
        self.assertEqual(p.exitcode, 0)
        self.assertEqual(got, b"requires-grad\n", "the worker's report was lost at its exit")

    def test_fallbacks_read_the_mount_table_once_per_directory(self):
        """Reporting fallbacks of files in one directory of a mount finds
        the mount's socket as a lease does (remembered per directory): the
        mount table is read for the first, not again for the others, and
        each fallback still reaches the daemon."""
        from gdsfs.autoload import _report

        _report.reset()
        self.addCleanup(_report.reset)
        mnt, got, th = self.report_listener(3)
        reads = []
        real = _mount.read_mountinfo
        with mock.patch.object(_mount, "read_mountinfo", side_effect=lambda *a: reads.append(1) or real(*a)):
            for i in range(3):
                _report.fallback("torch.Tensor.to", "cpu-target-gpu-staged", os.path.join(mnt, "w", "f%d.pt" % i))
        th.join(30)
        self.assertFalse(th.is_alive(), "the daemon stand-in did not get three reports")
        self.assertEqual(len(got), 3)
        self.assertTrue(all(b'"cpu-target-gpu-staged"' in g for g in got), got)
        self.assertEqual(len(reads), 1, "the mount table was read %d times for 3 fallbacks in one directory" % len(reads))

    def test_outside_mount_never_sent(self):
        """With a socket given (or GDSFS_SOCKET), a path under no gdsfs
        mount is refused before any connection."""
        d = os.path.realpath(_support.tmpdir())
        sock, ls = self.listener(d)
        self.mount_at(os.path.join(d, "mnt"), sock)
        for p in (os.path.join(d, "etc", "passwd"), "/etc/passwd"):
            with self.assertRaises(gdsfs.NotMountedError):
                gdsfs.open(p, socket=sock)
            os.environ["GDSFS_SOCKET"] = sock
            try:
                with self.assertRaises(gdsfs.NotMountedError):
                    gdsfs.open(p)
            finally:
                del os.environ["GDSFS_SOCKET"]
        ls.setblocking(False)
        with self.assertRaises(BlockingIOError, msg="a connection was made"):
            ls.accept()

    def test_file_link_off_the_mount_never_sent(self):
        """A file that is a symbolic link to a file on no gdsfs mount is
        not sent by the link's name (the daemon would follow it beneath
        SOURCE, where a plain open does not go); a link to a file of the
        mount is sent as that file."""
        d = os.path.realpath(_support.tmpdir())
        mnt = os.path.join(d, "mnt")
        os.makedirs(os.path.join(mnt, "sub"))
        os.makedirs(os.path.join(d, "plain"))
        for p in (os.path.join(d, "plain", "pub.pt"), os.path.join(mnt, "real.pt")):
            with open(p, "w") as f:
                f.write("x")
        os.symlink("../../plain/pub.pt", os.path.join(mnt, "sub", "off.pt"))
        os.symlink("../real.pt", os.path.join(mnt, "sub", "on.pt"))
        self.mount_at(mnt, os.path.join(d, "nobody-listens.sock"))
        with self.assertRaises(gdsfs.NotMountedError):  # not a connection error: nothing was tried
            gdsfs.open(os.path.join(mnt, "sub", "off.pt"))
        with self.assertRaises(gdsfs.NotMountedError):
            _mount.locate(os.path.join(mnt, "sub", "off.pt"))
        self.assertEqual(_mount.locate(os.path.join(mnt, "sub", "on.pt"))[1], "real.pt")

    def test_locator_of_many_paths_agrees_with_locate(self):
        """gdsfs.open_many's _locator (a directory's links resolved once
        for all its files) names every path as _locate does: files of a
        linked directory, a file that is a link to another file of the
        mount, a file at the mount's root, a missing file; a link off the mount
        fails as it does there."""
        d = os.path.realpath(_support.tmpdir())
        mnt = os.path.join(d, "mnt")
        os.makedirs(os.path.join(mnt, "v1", "deep"))
        os.makedirs(os.path.join(d, "plain"))
        for p in ("plain/pub.pt", "mnt/top.pt", "mnt/v1/a.pt", "mnt/v1/b.pt", "mnt/v1/deep/c.pt"):
            with open(os.path.join(d, p), "w") as f:
                f.write("x")
        os.symlink("mnt/v1", os.path.join(d, "latest"))
        os.symlink("deep/c.pt", os.path.join(mnt, "v1", "to-c.pt"))
        os.symlink("../../plain/pub.pt", os.path.join(mnt, "v1", "off.pt"))
        self.mount_at(mnt, "/run/x.sock")
        latest = os.path.join(d, "latest")
        paths = [os.path.join(latest, n) for n in ("a.pt", "b.pt", "to-c.pt", "a.pt")]
        paths += [os.path.join(mnt, "top.pt"), os.path.join(mnt, "v1", "deep", "c.pt"), os.path.join(latest, "deep", "..", "b.pt")]
        locate = _lease._locator(None)
        for p in paths:
            self.assertEqual(locate(p)[:3], _lease._locate(p, None)[:3], p)
        self.assertEqual([locate(p)[1] for p in paths[:3]], ["v1/a.pt", "v1/b.pt", "v1/deep/c.pt"])
        missing = os.path.join(latest, "missing.pt")  # sent: the daemon says ENOENT
        self.assertEqual(locate(missing)[:3], _lease._locate(missing, None)[:3])
        off = os.path.join(latest, "off.pt")
        with self.assertRaises(gdsfs.NotMountedError):
            _lease._locator(None)(off)
        with self.assertRaises(gdsfs.NotMountedError):
            locate(off)

    def test_locator_and_locate_walk_dot_dot_as_the_kernel_does(self):
        """A path whose `..` follows a linked directory names the file the
        kernel reaches (the link's target's parent's), to _locate and to
        _locator alike, even in a directory _locator has seen; one whose
        walk leaves the mount is not sent anywhere, though the file its
        text names (`..` undoing the link's name) is on the mount."""
        d = os.path.realpath(_support.tmpdir())
        mnt = os.path.join(d, "mnt")
        os.makedirs(os.path.join(mnt, "v1"))
        os.makedirs(os.path.join(mnt, "v2", "x"))
        os.makedirs(os.path.join(d, "plain", "sub"))
        for p in ("mnt/v1/a.pt", "mnt/v1/real.pt", "mnt/v2/b.pt", "mnt/v1/off.pt", "plain/off.pt"):
            with open(os.path.join(d, p), "w") as f:
                f.write("x")
        os.symlink("real.pt", os.path.join(mnt, "v1", "b.pt"))
        os.symlink("../v2/x", os.path.join(mnt, "v1", "sub"))
        os.symlink("../../plain/sub", os.path.join(mnt, "v1", "out"))
        self.mount_at(mnt, "/run/x.sock")
        # as text mnt/v1/b.pt (a link to real.pt); the kernel's mnt/v2/b.pt
        path = os.path.join(mnt, "v1", "sub", "..", "b.pt")
        locate = _lease._locator(None)
        locate(os.path.join(mnt, "v1", "a.pt"))  # mnt/v1 seen
        self.assertEqual(locate(path)[:3], _lease._locate(path, None)[:3])
        self.assertEqual(locate(path)[1], "v2/b.pt")
        # as text mnt/v1/off.pt, on the mount; the kernel's plain/off.pt, off it
        off = os.path.join(mnt, "v1", "out", "..", "off.pt")
        with self.assertRaises(gdsfs.NotMountedError):
            _lease._locate(off, None)
        with self.assertRaises(gdsfs.NotMountedError):
            locate(off)

    def test_resolve_fails_where_the_kernels_walk_fails(self):
        """A path whose walk by the kernel fails before or after a `..`
        (a name missing before it, a file before it, a missing name after
        a `..` that follows a link, a file with a trailing slash) raises
        the walk's error: its text names another, existing file. A
        missing last name is kept, in the directory walked; a missing
        name on a path without `..` is kept as it is."""
        from gdsfs import _mount

        d = os.path.realpath(_support.tmpdir())
        os.makedirs(os.path.join(d, "sub", "deep"))
        os.makedirs(os.path.join(d, "other"))
        for f in ("other/f", "sub/deep/f", "g"):
            open(os.path.join(d, f), "w").close()
        os.symlink("sub/deep", os.path.join(d, "link"))
        for p, err in (("link/../other/f", errno.ENOENT), ("link/missing/../f", errno.ENOENT),
                       ("g/../other/f", errno.ENOTDIR), ("g/", errno.ENOTDIR)):
            with self.subTest(p):
                with self.assertRaises(OSError) as cm:
                    _mount._resolve(os.path.join(d, p))
                self.assertEqual(cm.exception.errno, err)
        self.assertEqual(_mount._resolve(os.path.join(d, "link", "..", "new")), os.path.join(d, "sub", "new"))
        self.assertEqual(_mount._resolve(os.path.join(d, "nodir", "new")), os.path.join(d, "nodir", "new"))
        self.assertEqual(_mount._resolve(os.path.join(d, "link", "f")), os.path.join(d, "sub", "deep", "f"))

    def test_a_mount_point_is_not_remembered_for_its_directory(self):
        """Locating a mount point (a directory, which the daemon refuses)
        says nothing of the other files of the directory it is in: one
        under no gdsfs mount is still not sent anywhere, by _locate as by
        _locator."""
        d = os.path.realpath(_support.tmpdir())
        mnt = os.path.join(d, "mnt")
        os.makedirs(mnt)
        with open(os.path.join(d, "other.pt"), "w") as f:
            f.write("x")
        self.mount_at(mnt, "/run/x.sock")
        other = os.path.join(d, "other.pt")
        self.assertEqual(_lease._locate(mnt, None)[:2], ("/run/x.sock", "."))
        with self.assertRaises(gdsfs.NotMountedError):
            _lease._locate(other, None)
        gdsfs.disconnect()
        locate = _lease._locator(None)
        self.assertEqual(locate(mnt)[:2], ("/run/x.sock", "."))
        with self.assertRaises(gdsfs.NotMountedError):
            locate(other)

    def test_repointed_link_is_followed(self):
        """After `latest` is repointed, a path through it is looked up at
        its new target: another directory of the mount, or one on none."""
        d = os.path.realpath(_support.tmpdir())
        mnt = os.path.join(d, "mnt")
        for sub in ("mnt/v1", "mnt/v2", "plain"):
            os.makedirs(os.path.join(d, sub))
        self.mount_at(mnt, "/run/x.sock")
        latest = os.path.join(d, "latest")

        def point(to):
            os.symlink(to, latest + ".new")
            os.rename(latest + ".new", latest)

        p = os.path.join(latest, "ckpt.pt")
        for to in ("mnt/v1", "mnt/v2", "mnt/v1"):
            point(to)
            for _ in range(2):  # the second is answered from the memory
                self.assertEqual(_lease._locate(p, None)[1], to[len("mnt/"):] + "/ckpt.pt", to)
        point("plain")
        with self.assertRaises(gdsfs.NotMountedError):
            _lease._locate(p, None)

    def test_connect_timeout(self):
        """Connecting to a listener that accepts nothing, its backlog full,
        returns an error instead of waiting for ever."""
        from gdsfs import _proto

        d = os.path.realpath(_support.tmpdir())
        sock = os.path.join(d, "full.sock")
        ls = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.addCleanup(ls.close)
        ls.bind(sock)
        ls.listen(0)
        held = []
        self.addCleanup(lambda: [c.close() for c in held])
        self.mount_at(os.path.join(d, "mnt"), sock)
        old, _proto.CONNECT_TIMEOUT = _proto.CONNECT_TIMEOUT, 0.05
        self.addCleanup(setattr, _proto, "CONNECT_TIMEOUT", old)
        with self.assertRaises(OSError):
            for _ in range(3):  # the kernel queues backlog+1 connections; the next one cannot be
                held.append(gdsfs._proto.Conn(sock))
        with self.assertRaises(OSError):
            gdsfs.open(os.path.join(d, "mnt", "f"))


class GoldenClientTests(unittest.TestCase):
    """proto/testdata replayed against this client: a fake daemon follows
    each transcript, checks that the client's requests are the transcript's
    and answers with its answers and memfds of the files. The daemon's Go
    tests replay the same files against the real server, and the Go
    client's tests against a fake daemon of their own."""

    def test_transcripts(self):
        for name in sorted(os.listdir(golden.DIR)):
            if name.endswith(".jsonl"):
                with self.subTest(transcript=name):
                    golden.replay_client(self, os.path.join(golden.DIR, name))


def _escape_mount(p):
    return p.replace("\\", r"\134").replace(" ", r"\040").replace("\t", r"\011").replace("\n", r"\012")


class MountTests(unittest.TestCase):
    """proto/testdata/mounts.json: the mount lookup cases the Go client
    checks too (nearest mount point, bind mounts, another filesystem mounted
    inside a gdsfs mount refused)."""

    def setUp(self):
        with open(os.path.join(golden.DIR, "mounts.json")) as f:
            self.mc = json.load(f)
        self.t = os.path.realpath(_support.tmpdir())
        self.dirs = {"root": self.t}
        for k, name in self.mc["names"].items():
            self.dirs[k] = os.path.join(self.t, name)
            os.makedirs(self.dirs[k])
        for k, sock in self.mc["sockets"].items():
            os.makedirs(os.path.join(self.dirs[k], ".gdsfs"))
            with open(os.path.join(self.dirs[k], ".gdsfs", "socket"), "w") as f:
                f.write(sock + "\n")
        text = "\n".join(self.fill(l, True) for l in self.mc["mountinfo"])
        self.info = _mount.parse_mountinfo(text.encode())
        self.env = os.environ.pop("GDSFS_SOCKET", None)

    def fill(self, s, esc=False):
        for k, d in self.dirs.items():
            s = s.replace("{%s}" % k, _escape_mount(d) if esc else d)
        return s

    def tearDown(self):
        if self.env is not None:
            os.environ["GDSFS_SOCKET"] = self.env

    def test_parse(self):
        self.assertEqual([e.fstype for e in self.info],
                         ["ext4", "fuse.gdsfs", "nfs4", "tmpfs", "fuse.gdsfs", "fuse.gdsfs", "fuse.gdsfs"])
        self.assertEqual(self.info[5].mountpoint, self.dirs["sp"])
        self.assertEqual(self.info[4].root, "/data")
        self.assertEqual(_mount.unescape(rb"a\040b\134c\012"), b"a b\\c\n")

    def test_shared_cases(self):
        for c in self.mc["cases"]:
            p = self.fill(c["path"])
            with self.subTest(path=c["path"]):
                if "error" in c:
                    with self.assertRaises(gdsfs.NotMountedError) as cm:
                        _mount.locate(p, mountinfo=self.info)
                    self.assertEqual(cm.exception.errno, errno.ENODEV)
                    self.assertIn(c["error"], str(cm.exception))
                    continue
                sock, rel, _ = _mount.locate(p, mountinfo=self.info)
                self.assertEqual((sock, rel), (c["socket"], c["rel"]))

    def test_symlinks_and_relative(self):
        mnt = self.dirs["mnt"]
        link = os.path.join(self.t, "link")
        os.makedirs(os.path.join(mnt, "a"))
        os.symlink(os.path.join(mnt, "a"), link)
        self.assertEqual(_mount.locate(os.path.join(link, "f"), mountinfo=self.info)[1], "a/f")
        cwd = os.getcwd()
        os.chdir(mnt)
        try:
            self.assertEqual(_mount.locate("q/r", mountinfo=self.info)[1], "q/r")
        finally:
            os.chdir(cwd)

    def test_socket_override(self):
        """An explicit socket (or GDSFS_SOCKET) picks the socket for a path
        under a gdsfs mount, sent relative to it; a path under no gdsfs
        mount is refused, never sent."""
        mnt = self.dirs["mnt"]
        inside, outside = os.path.join(mnt, "a", "f"), os.path.join(self.t, "anything")
        self.assertEqual(_mount.locate(inside, socket="/s", mountinfo=self.info), ("/s", "a/f", mnt))
        orphan = os.path.join(self.dirs["orphan"], "f")
        self.assertEqual(_mount.locate(orphan, socket="/s", mountinfo=self.info)[:2], ("/s", "sub/f"))
        os.environ["GDSFS_SOCKET"] = "/e"
        try:
            self.assertEqual(_mount.locate(inside, mountinfo=self.info), ("/e", "a/f", mnt))
            for p in (outside, "/etc/shadow", os.path.join(mnt, "nfs", "f")):
                with self.assertRaises(gdsfs.NotMountedError, msg=p):
                    _mount.locate(p, mountinfo=self.info)
                with self.assertRaises(gdsfs.NotMountedError, msg=p):
                    _mount.locate(p, socket="/s", mountinfo=self.info)
        finally:
            del os.environ["GDSFS_SOCKET"]

    def test_owner(self):
        """The mount's owner is its user_id= super option."""
        self.assertEqual([e.owner for e in self.info], [None, 0, None, None, None, None, None])
        t = _mount.find(os.path.join(self.dirs["mnt"], "f"), mountinfo=self.info)
        self.assertEqual((t.socket, t.rel, t.owner), ("/run/a.sock", "f", 0))


class LayoutTests(unittest.TestCase):
    def test_layout(self):
        L = _lease._layout
        self.assertEqual(L(10, 1, None, 0), ((10,), 10))
        self.assertEqual(L(10, 4, None, 0), ((2,), 8))
        self.assertEqual(L(10, 4, None, 4), ((1,), 4))
        self.assertEqual(L(10, 2, (2, 2), 2), ((2, 2), 8))
        self.assertEqual(L(10, 2, 3, 0), ((3,), 6))
        self.assertEqual(L(10, 8, (), 0), ((), 8))
        self.assertEqual(L(0, 4, None, 0), ((0,), 0))
        self.assertEqual(L(10, 1, None, 10), ((0,), 0))
        for args, exc in [((10, 4, None, 2), ValueError), ((10, 1, None, 11), ValueError),
                          ((10, 1, None, -1), ValueError), ((10, 2, (3, 2), 0), ValueError),
                          ((10, 1, (-1,), 0), ValueError), ((10, 1, None, 1.0), TypeError),
                          ((10, 1, "ab", 0), ValueError), ((10, 1, object(), 0), TypeError)]:
            with self.subTest(args=args):
                with self.assertRaises(exc):
                    L(*args)

    def test_uuid(self):
        b = bytes(range(16))
        self.assertEqual(format_uuid(b), "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f")


if __name__ == "__main__":
    unittest.main()
