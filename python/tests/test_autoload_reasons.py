"""gdsfs.autoload's fallback reasons that test_autoload.py does not bring
about: each call falls back with its reason, counted once, and gives what
the original call gives (the same result or the same exception type), on
a real host-backend mount. Needs torch: fails in CI without it."""

import inspect
import io
import os
import unittest
import zipfile

from test_autoload import AutoloadCase


def stored_zip(names):
    """A zip archive of the given names (each holding its name), stored
    uncompressed, as torch.save writes."""
    b = io.BytesIO()
    with zipfile.ZipFile(b, "w", compression=zipfile.ZIP_STORED) as z:
        for n in names:
            z.writestr(n, n.encode())
    return b.getvalue()


class TestTorchLoadReasons(AutoloadCase):
    def same_outcome(self, mnt, src, **kw):
        """torch.load of mnt gives what the original gives for src."""
        torch = self.torch
        try:
            want = torch.load._gdsfs_original(src, **kw)
        except Exception as e:
            with self.assertRaises(type(e)):
                torch.load(mnt, **kw)
            return None
        got = torch.load(mnt, **kw)
        self.assertEqual(type(got), type(want))
        return got, want

    def test_archive_reasons(self):
        # (torch.jit.save compresses its code records: such an archive
        # falls back as format:compressed before its constants are seen.)
        for name, data, reason in (
            ("torchscript.pt", stored_zip(["archive/data.pkl", "archive/constants.pkl", "archive/version"]), "format:torchscript"),
            ("nodata.pt", stored_zip(["archive/version", "archive/other.pkl"]), "format:no-data.pkl"),
            ("empty.pt", stored_zip([]), "format:empty-zip"),
            ("layout.pt", stored_zip(["a/data.pkl", "b/version"]), "format:zip-layout"),
        ):
            with self.subTest(reason):
                self.A.reset()
                mnt, src = self.put("rs/" + name, data)
                self.same_outcome(mnt, src)
                self.assertEqual(self.A.fallbacks(), {reason: 1})
                self.assertEqual(self.A.served(), {})
        self.assertEqual(self.mount.wait_leases(0), 0)

    def test_mmap_of_a_file_object(self):
        torch = self.torch
        if "mmap" not in inspect.signature(torch.load._gdsfs_original).parameters:
            self.skipTest("SKIPPED: torch %s's load has no mmap argument (the GPU tier's torch has it)" % torch.__version__)
        mnt, src = self.put("rs/mmap.pt", b"")
        torch.save({"x": torch.arange(5)}, src)
        with open(mnt, "rb") as f, open(src, "rb") as g:
            try:
                want = torch.load._gdsfs_original(g, mmap=True)
            except Exception as e:
                with self.assertRaises(type(e)):
                    torch.load(f, mmap=True)
            else:
                self.assertTrue(torch.equal(torch.load(f, mmap=True)["x"], want["x"]))
        self.assertEqual(self.A.fallbacks(), {"mmap-file-object": 1})


class TestSafetensorsReasons(AutoloadCase):
    def test_framework_not_torch(self):
        safe_open = self.st.safe_open
        mnt, src = self.put("rs/fw.safetensors", os.path.join(_fixtures(), "all_dtypes.safetensors"))

        def keys(path):
            with safe_open(path, framework="numpy") as f:
                return sorted(f.keys())

        try:
            want = self.original(keys, src)
        except Exception as e:
            self.A.reset()
            with self.assertRaises(type(e)):
                keys(mnt)
        else:
            self.A.reset()
            self.assertEqual(keys(mnt), want)
        self.assertEqual(self.A.fallbacks(), {"framework:numpy": 1})

    def test_client_error(self):
        """A client failure that is not an OSError (a mapping the client
        could not make) falls back, named by its type."""
        from gdsfs.autoload import _serve
        import safetensors.torch as stt

        mnt, src = self.put("rs/ce.safetensors", os.path.join(_fixtures(), "all_dtypes.safetensors"))
        want = self.original(stt.load_file._gdsfs_original, src)

        def broken(path, *a, **kw):
            raise ValueError("no mapping for %s" % path)

        real = _serve.gdsfs.open
        _serve.gdsfs.open = broken
        try:
            got = stt.load_file(mnt)
        finally:
            _serve.gdsfs.open = real
        self.assertEqual(sorted(got), sorted(want))
        for k in want:
            self.assertSameTensor(got[k], want[k], k)
        self.assertEqual(self.A.fallbacks(), {"client-error:ValueError": 1})


def _fixtures():
    import _autoload_support as S

    return S.ST_FIXTURES


if __name__ == "__main__":
    unittest.main()
