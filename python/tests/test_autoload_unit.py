"""The autoloader's parsers and its background queue, without a mount or
torch: the safetensors header (what the library refuses is refused here
too, by reason), the zip directory of torch.save archives (stored records
only, zip64 too), and the thread that handles what is queued for it."""

import io
import json
import os
import struct
import threading
import unittest
import zipfile
from unittest import mock

import _support  # noqa: F401  (puts python/ on sys.path)
from gdsfs.autoload import _queue, _stformat, _zipdir


def st_file(head, data=b""):
    h = json.dumps(head).encode()
    return struct.pack("<Q", len(h)) + h + data


def reader(b):
    return lambda off, n: b[off:off + n]


class TestSafetensorsHeader(unittest.TestCase):
    def parse(self, b):
        return _stformat.parse(reader(b), len(b))

    def test_valid(self):
        b = st_file({"__metadata__": {"k": "v"}, "b": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                     "a": {"dtype": "U8", "shape": [], "data_offsets": [8, 9]},
                     "e": {"dtype": "I64", "shape": [0, 3], "data_offsets": [9, 9]}}, b"\0" * 9)
        h = self.parse(b)
        self.assertEqual(h.keys(), ["a", "b", "e"])
        self.assertEqual(h.offset_keys(), ["b", "a", "e"])
        self.assertEqual(h.metadata, {"k": "v"})
        self.assertEqual(h.tensors["a"].begin, len(b) - 1)

    def test_refused(self):
        cases = {
            "format:short": b"\0" * 4,
            "format:header-size": struct.pack("<Q", 1 << 40) + b"{}",
            "format:header-json": struct.pack("<Q", 2) + b"[]",
            "format:metadata": st_file({"__metadata__": {"k": 1}}),
            "format:dtype": st_file({"a": {"dtype": "X9", "shape": [1], "data_offsets": [0, 1]}}, b"\0"),
            "format:entry-size": st_file({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 4),
            "format:entry": st_file({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, b"\0" * 4),
            "format:offsets": st_file({"a": {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]}}, b"\0" * 2),
        }
        for reason, b in cases.items():
            with self.subTest(reason=reason):
                with self.assertRaises(_stformat.FormatError) as e:
                    self.parse(b)
                self.assertEqual(e.exception.reason, reason)
        with self.assertRaises(_stformat.FormatError) as e:  # data past the last tensor
            self.parse(st_file({"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}, b"\0\0"))
        self.assertEqual(e.exception.reason, "format:offsets")


class TestZipDirectory(unittest.TestCase):
    def archive(self, compress=zipfile.ZIP_STORED, zip64=False):
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", compression=compress) as z:
            z.writestr("archive/data.pkl", b"pickle-bytes")
            with z.open(zipfile.ZipInfo("archive/data/0"), "w", force_zip64=zip64) as f:
                f.write(b"0123456789" * 10)
            z.writestr("archive/version", b"3\n")
        return buf.getvalue()

    def test_offsets(self):
        for zip64 in (False, True):
            with self.subTest(zip64=zip64):
                b = self.archive(zip64=zip64)
                recs = _zipdir.records(reader(b), len(b))
                self.assertEqual(sorted(recs), ["data.pkl", "data/0", "version"])
                r = recs["data/0"]
                self.assertEqual(b[r.offset:r.offset + r.size], b"0123456789" * 10)
                r = recs["data.pkl"]
                self.assertEqual(b[r.offset:r.offset + r.size], b"pickle-bytes")

    def test_refused(self):
        b = self.archive(compress=zipfile.ZIP_DEFLATED)
        with self.assertRaises(_zipdir.ZipError) as e:
            _zipdir.records(reader(b), len(b))
        self.assertEqual(e.exception.reason, "format:compressed")
        with self.assertRaises(_zipdir.ZipError) as e:
            _zipdir.records(reader(b"not a zip" * 10), 90)
        self.assertEqual(e.exception.reason, "format:not-zip")


class TestQueueThread(unittest.TestCase):
    def test_items_are_handled_in_order_before_wait_returns(self):
        got = []
        q = _queue.QueueThread("gdsfs-test-queue", got.append)
        self.assertTrue(q.wait(0), "nothing was put, yet wait() waited")
        self.assertIsNone(q._thread, "wait() started a thread")
        for i in range(100):
            q.put(i)
        self.assertTrue(q.wait(60))
        self.assertEqual(got, list(range(100)))
        self.assertEqual(q._thread.name, "gdsfs-test-queue")
        self.assertTrue(q._thread.daemon)

    def test_a_batch_is_what_was_put_while_the_last_was_handled(self):
        entered, go, got = threading.Event(), threading.Event(), []

        def handle(items):
            got.append(items)
            entered.set()
            go.wait(60)
        q = _queue.QueueThread("gdsfs-test-queue", handle, batch=True)
        q.put(0)
        self.assertTrue(entered.wait(60))
        for i in range(1, 4):
            q.put(i)
        self.assertFalse(q.wait(0), "wait() returned while an item was being handled")
        go.set()
        self.assertTrue(q.wait(60))
        self.assertEqual(got, [[0], [1, 2, 3]])

    def test_a_handler_that_raises_leaves_the_thread_going(self):
        """An item whose handling raises is given up; what is put after it
        is handled, and wait() returns."""
        seen = []

        def handle(item):
            if item == "bad":
                raise ValueError(item)
            if item == "exit":
                raise SystemExit(1)
            seen.append(item)

        q = _queue.QueueThread("gdsfs-test-queue", handle)
        for item in ("bad", "after", "exit", "last"):
            q.put(item)
        self.assertTrue(q.wait(60), "wait() did not return: the thread ended on the handler's exception")
        self.assertEqual(seen, ["after", "last"])

    def test_a_thread_that_cannot_start_leaves_no_queue(self):
        got = []
        q = _queue.QueueThread("gdsfs-test-queue", got.append)
        with mock.patch.object(threading.Thread, "start", side_effect=RuntimeError("can't start new thread")):
            self.assertRaises(RuntimeError, q.put, 1)
            self.assertRaises(RuntimeError, q.start)
        self.assertIsNone(q._queue)
        self.assertIsNone(q._thread)
        self.assertTrue(q.wait(0), "wait() waited for an item that was never queued")
        self.assertTrue(q.start())
        self.assertFalse(q.start())
        q.put(2)
        self.assertTrue(q.wait(60))
        self.assertEqual(got, [2])

    def test_a_forked_child_starts_its_own_thread(self):
        """The parent's thread is not in a forked child: the child's queue
        starts empty, with no thread, and its first put starts one."""
        got = []
        q = _queue.QueueThread("gdsfs-test-queue", got.append)
        q.put("parent")
        self.assertTrue(q.wait(60))
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                if q._thread is not None or not q.wait(0):
                    code = 2
                else:
                    q.put("child")
                    code = 0 if q.wait(60) and got == ["parent", "child"] else 3
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        self.assertNotEqual(code, 2, "the child kept the parent's thread and queue")
        self.assertEqual(code, 0, "the child's put was not handled")


if __name__ == "__main__":
    unittest.main()
