"""The autoloader's parsers without a mount or torch: the safetensors
header (what the library refuses is refused here too, by reason) and the
zip directory of torch.save archives (stored records only, zip64 too)."""

import io
import json
import struct
import unittest
import zipfile

import _support  # noqa: F401  (puts python/ on sys.path)
from gdsfs.autoload import _stformat, _zipdir


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


if __name__ == "__main__":
    unittest.main()
