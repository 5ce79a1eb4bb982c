"""Drops the client sends on its pooled connection, against a scripted fake
daemon: one for each full grant it does not keep mapped, including those
it could not map or gives back."""

import os
import unittest

import _support  # noqa: F401 (puts python/ on sys.path)
from test_unit import ACQ, FakeDaemon, answer, fake_root_mount, memfd

import gdsfs

OK = answer({"ok": True, "epoch": 7})


def full(lease, gen, size=4096, **kw):
    return dict(ACQ, lease=lease, generation=gen, size=size, chunks=[{"len": 4096}], cache=True, **kw)


class DropUnitTests(unittest.TestCase):
    def setUp(self):
        fake_root_mount(self)
        gdsfs.disconnect()
        self.fds = []
        self.addCleanup(lambda: [os.close(fd) for fd in self.fds])

    def fd(self):
        fd = memfd(b"x" * 4096, 4096)
        self.fds.append(fd)
        return fd

    def fake(self, handler):
        f = FakeDaemon(handler)
        self.addCleanup(f.close)
        self.addCleanup(gdsfs.disconnect)
        return f

    def drops(self, f):
        return sorted(r["generation"] for r in f.requests if r["op"] == "drop")

    def test_repeat_grant_not_mapped_is_dropped(self):
        """A repeat lease answered with a full grant that fails to map is
        dropped as well as released, and the old mapping is undone and
        dropped, on a pooled connection that stays open (it holds b)."""
        acquires = []

        def handler(req):
            if req["op"] in ("release", "drop"):
                return [("send", OK, None)]
            if req["path"] == "b":
                return [("send", answer(full(20, 9)), [self.fd()])]
            acquires.append(req)
            if len(acquires) == 1:
                return [("send", answer(full(10, 1)), [self.fd()])]
            if len(acquires) == 2:  # the repeat: new bytes whose size passes their chunks
                return [("send", answer(full(11, 2, size=8192)), [self.fd()])]
            return [("send", answer(full(12, 3)), [self.fd()])]

        f = self.fake(handler)
        b = gdsfs.open("/b", socket=f.path)
        gdsfs.open("/a", socket=f.path).close()  # kept
        try:
            gdsfs.open("/a", socket=f.path).close()
        except (OSError, ValueError):
            pass
        b.close()
        gdsfs.disconnect()
        self.assertTrue(f.wait(), "the pooled connection was never closed: a mapping of it is still counted")
        self.assertIn(2, self.drops(f), "no drop of the full grant that failed to map: %r" % f.requests)
        self.assertIn(1, self.drops(f), "no drop of the old mapping: %r" % f.requests)

    def test_repeat_many_refused_gives_back_the_rest(self):
        """A repeat acquire_many whose first item is refused gives back the
        items after it: a reuse is released, a full grant released and
        dropped, on a pooled connection that stays open (it holds b)."""

        def handler(req):
            if req["op"] in ("release", "drop"):
                return [("send", OK, None)]
            if req["op"] == "acquire_many":
                items = [{"ok": False, "errno": "EACCES", "error": "a: nope"},
                         full(31, 5), dict(full(32, 3), reuse=True, chunks=None)]
                return [("send", answer({"ok": True, "epoch": 7, "files": items}), [self.fd()])]
            gen = {"a": 1, "b": 9, "c": 2, "d": 3}[req["path"]]
            return [("send", answer(full(10 + gen, gen)), [self.fd()])]

        f = self.fake(handler)
        b = gdsfs.open("/b", socket=f.path)
        for p in ("/a", "/c", "/d"):
            gdsfs.open(p, socket=f.path).close()  # kept
        with self.assertRaises(OSError):
            gdsfs.open_many(["/a", "/c", "/d"], socket=f.path)
        b.close()
        gdsfs.disconnect()
        self.assertTrue(f.wait())
        released = [r["lease"] for r in f.requests if r["op"] == "release"]
        self.assertIn(31, released, "the full grant after the refused item was never released: %r" % f.requests)
        self.assertIn(32, released, "the reuse after the refused item was never released: %r" % f.requests)
        self.assertIn(5, self.drops(f), "the full grant after the refused item was never dropped: %r" % f.requests)

    def test_batch_with_wrong_item_count_gives_back_the_grants(self):
        """A fresh acquire_many answered with fewer items than paths (the
        daemon's protocol error) gives back the items it granted, on a
        pooled connection that stays open (it holds b)."""

        def handler(req):
            if req["op"] in ("release", "drop"):
                return [("send", OK, None)]
            if req["op"] == "acquire_many":
                return [("send", answer({"ok": True, "epoch": 7, "files": [full(31, 5)]}), [self.fd()])]
            return [("send", answer(full(20, 9)), [self.fd()])]

        f = self.fake(handler)
        b = gdsfs.open("/b", socket=f.path)
        with self.assertRaises(OSError):
            gdsfs.open_many(["/a", "/c"], socket=f.path)
        b.close()
        gdsfs.disconnect()
        self.assertTrue(f.wait())
        self.assertIn(31, [r["lease"] for r in f.requests if r["op"] == "release"], "the granted item was never released: %r" % f.requests)
        self.assertIn(5, self.drops(f), "the granted item was never dropped: %r" % f.requests)


if __name__ == "__main__":
    unittest.main()
