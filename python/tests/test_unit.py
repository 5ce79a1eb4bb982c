"""Client tests that need no mount: the protocol against a scripted fake
daemon (answers split across reads, memfds as SCM_RIGHTS), error mapping,
mountinfo parsing and mount lookup, shape/offset validation."""

import array
import errno
import json
import os
import socket
import threading
import time
import unittest

import _support  # noqa: F401 (puts python/ on sys.path)

import gdsfs
from gdsfs import _lease, _mount
from gdsfs._cuda import format_uuid


def memfd(data, size):
    fd = os.memfd_create("gdsfs-test", os.MFD_CLOEXEC)
    os.ftruncate(fd, size)
    os.pwrite(fd, data, 0)
    return fd


class FakeDaemon:
    """Serves one connection; handler(request dict) returns a list of
    actions: ("send", bytes, fds), ("sleep", s), ("close",)."""

    def __init__(self, handler, on_accept=()):
        self.on_accept = list(on_accept)
        self.dir = _support.tmpdir()
        self.path = os.path.join(self.dir, "fake.sock")
        self.handler = handler
        self.requests = []
        self.ls = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.ls.bind(self.path)
        self.ls.listen(4)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        try:
            c, _ = self.ls.accept()
        except OSError:
            return
        with c:
            for act in self.on_accept:
                if act[0] == "send":
                    c.sendall(act[1])
                elif act[0] == "sleep":
                    time.sleep(act[1])
                elif act[0] == "close":
                    return
            buf = b""
            while True:
                while b"\n" not in buf:
                    d = c.recv(4096)
                    if not d:
                        return
                    buf += d
                line, _, buf = buf.partition(b"\n")
                req = json.loads(line)
                self.requests.append(req)
                for act in self.handler(req):
                    if act[0] == "send":
                        _, data, fds = act
                        if fds:
                            c.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
                        else:
                            c.sendall(data)
                    elif act[0] == "sleep":
                        time.sleep(act[1])
                    elif act[0] == "close":
                        return

    def close(self):
        self.ls.close()
        self.thread.join(5)


def answer(d):
    return (json.dumps(d) + "\n").encode()


def split(data, fds, pieces=(1, 1, 3, 10)):
    """Actions sending data in small pieces, fds with the first."""
    acts, i = [], 0
    for n in pieces:
        acts += [("send", data[i : i + n], fds if i == 0 else None), ("sleep", 0.01)]
        i += n
    return acts + [("send", data[i:], None)]


def nfds():
    return len(os.listdir("/proc/self/fd"))


ACQ = {"ok": True, "epoch": 7, "lease": 3, "generation": 1, "device": "host", "sharing": "shared"}


class ProtocolTests(unittest.TestCase):
    def fake(self, handler, on_accept=()):
        f = FakeDaemon(handler, on_accept)
        self.addCleanup(f.close)
        self.addCleanup(gdsfs.disconnect)  # runs first: the shared connection
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
        before = nfds()
        lease = gdsfs.open("/some/where/file.bin", socket=f.path)
        self.assertEqual(f.requests[0], {"op": "acquire", "path": "/some/where/file.bin"})
        self.assertEqual((lease.size, lease.id, lease.epoch, lease.device, lease.chunks), (5000, 3, 7, "host", (4096, 4096)))
        self.assertEqual(bytes(lease.memoryview()), a + b)
        self.assertEqual(lease.read(4000, 200), (a + b)[4000:4200])
        lease.close()
        self.assertTrue(lease.released)
        self.assertEqual(f.requests[1], {"op": "release", "lease": 3, "epoch": 7})
        gdsfs.disconnect()  # the process's shared connection
        self.assertEqual(nfds(), before, "received descriptors and the socket must be closed")

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

    def test_fd_count_mismatch(self):
        fd = memfd(b"x", 4096)
        self.addCleanup(os.close, fd)

        def handler(req):
            if req["op"] == "acquire":
                return [("send", answer(dict(ACQ, size=5000, chunks=[{"len": 4096}, {"len": 4096}])), [fd])]
            return [("send", answer({"ok": True}), None)]

        f = self.fake(handler)
        before = nfds()
        with self.assertRaises(OSError) as cm:
            gdsfs.open("/a/b", socket=f.path)
        self.assertEqual(cm.exception.errno, errno.EPROTO)
        self.assertEqual([r["op"] for r in f.requests], ["acquire", "release"])
        gdsfs.disconnect()
        self.assertEqual(nfds(), before)

    def test_daemon_gone_before_close(self):
        fd = memfd(b"hello", 4096)
        self.addCleanup(os.close, fd)
        f = self.fake(lambda req: [("send", answer(dict(ACQ, size=5, chunks=[{"len": 4096}])), [fd]), ("close",)])
        lease = gdsfs.open("/a/b", socket=f.path)
        self.assertEqual(lease.read(), b"hello")
        time.sleep(0.05)
        lease.close()  # no error: the lease ended with its daemon
        self.assertTrue(lease.released)

    def test_release_error_raises(self):
        fd = memfd(b"hello", 4096)
        self.addCleanup(os.close, fd)

        def handler(req):
            if req["op"] == "acquire":
                return [("send", answer(dict(ACQ, size=5, chunks=[{"len": 4096}])), [fd])]
            return [("send", answer({"ok": False, "errno": "EINVAL", "error": "no lease 3 on this connection"}), None)]

        f = self.fake(handler)
        lease = gdsfs.open("/a/b", socket=f.path)
        with self.assertRaises(OSError) as cm:
            lease.close()
        self.assertEqual(cm.exception.errno, errno.EINVAL)
        self.assertTrue(lease.released, "unmapped even so")
        lease.close()

    def test_refused_before_request(self):
        # ipc.max_connections: the daemon answers at once and hangs up.
        f = self.fake(None, on_accept=[("send", answer({"ok": False, "errno": "EMFILE", "error": "more than ipc.max_connections (256) clients"}), None), ("close",)])
        time.sleep(0.05)
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
        f = self.fake(lambda req: [("send", answer(dict(ACQ, chunks=[{"len": 4096}])), [fd]) if req["op"] == "acquire"
                                   else ("send", answer({"ok": True}), None)])
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
        self.assertEqual(f.requests, [{"op": "stat", "path": "/x/y"}])
        self.assertEqual((st["size"], st["state"], st["load_path"]), (9, "resident", "host"))


MOUNTINFO = rb"""22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
40 22 0:38 / %(mnt)s rw,nosuid,nodev,relatime shared:5 - fuse.gdsfs /src rw,user_id=0
41 40 0:50 / %(mnt)s/nfs rw - nfs4 srv:/x rw
42 22 0:38 /data %(bind)s rw - fuse.gdsfs /src rw
43 22 0:60 / %(sp)s rw - fuse.gdsfs /src2 rw
44 22 0:61 /sub %(orphan)s rw - fuse.gdsfs /src3 rw
"""


class MountTests(unittest.TestCase):
    def setUp(self):
        self.t = os.path.realpath(_support.tmpdir())
        self.mnt = os.path.join(self.t, "mnt")
        self.bind = os.path.join(self.t, "bind")
        self.sp = os.path.join(self.t, "my mnt\tx")
        self.orphan = os.path.join(self.t, "orphan")
        for d, sock in ((self.mnt, "/run/a.sock"), (self.sp, "/run/b.sock")):
            os.makedirs(os.path.join(d, ".gdsfs"))
            with open(os.path.join(d, ".gdsfs", "socket"), "w") as f:
                f.write(sock + "\n")
        os.makedirs(self.bind)
        os.makedirs(self.orphan)
        esc = lambda p: p.encode().replace(b" ", rb"\040").replace(b"\t", rb"\011")
        self.info = _mount.parse_mountinfo(MOUNTINFO % {b"mnt": esc(self.mnt), b"bind": esc(self.bind),
                                                         b"sp": esc(self.sp), b"orphan": esc(self.orphan)})
        self.env = os.environ.pop("GDSFS_SOCKET", None)

    def tearDown(self):
        if self.env is not None:
            os.environ["GDSFS_SOCKET"] = self.env

    def test_parse(self):
        self.assertEqual([e.fstype for e in self.info], ["ext4", "fuse.gdsfs", "nfs4", "fuse.gdsfs", "fuse.gdsfs", "fuse.gdsfs"])
        self.assertEqual(self.info[4].mountpoint, self.sp)
        self.assertEqual(self.info[3].root, "/data")
        self.assertEqual(_mount.unescape(rb"a\040b\134c\012"), b"a b\\c\n")

    def test_locate(self):
        self.assertEqual(_mount.locate(os.path.join(self.mnt, "a/b/c.bin"), mountinfo=self.info),
                         ("/run/a.sock", "a/b/c.bin", self.mnt))
        self.assertEqual(_mount.locate(os.path.join(self.sp, "f"), mountinfo=self.info), ("/run/b.sock", "f", self.sp))
        # A bind mount of SOURCE/data: the path is sent from SOURCE's root.
        self.assertEqual(_mount.locate(os.path.join(self.bind, "x/y"), mountinfo=self.info),
                         ("/run/a.sock", "data/x/y", self.bind))
        with self.assertRaises(gdsfs.NotMountedError) as cm:
            _mount.locate(os.path.join(self.mnt, "nfs/f"), mountinfo=self.info)
        self.assertIn("nfs4", str(cm.exception))
        with self.assertRaises(gdsfs.NotMountedError):
            _mount.locate(os.path.join(self.t, "f"), mountinfo=self.info)
        with self.assertRaises(gdsfs.NotMountedError) as cm:
            _mount.locate(os.path.join(self.orphan, "f"), mountinfo=self.info)
        self.assertIn("GDSFS_SOCKET", str(cm.exception))
        # Relative paths and symlinked directories resolve first.
        link = os.path.join(self.t, "link")
        os.symlink(os.path.join(self.mnt, "a"), link)
        self.assertEqual(_mount.locate(os.path.join(link, "f"), mountinfo=self.info)[1], "a/f")
        cwd = os.getcwd()
        os.chdir(self.mnt)
        try:
            self.assertEqual(_mount.locate("q/r", mountinfo=self.info)[1], "q/r")
        finally:
            os.chdir(cwd)

    def test_socket_override(self):
        p = os.path.join(self.t, "anything")
        self.assertEqual(_mount.locate(p, socket="/s", mountinfo=self.info), ("/s", p, None))
        os.environ["GDSFS_SOCKET"] = "/e"
        try:
            self.assertEqual(_mount.locate(p, mountinfo=self.info), ("/e", p, None))
        finally:
            del os.environ["GDSFS_SOCKET"]


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
