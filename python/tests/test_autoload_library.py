"""The served safetensors calls against the library where the library is
strict: pread slices, devices it refuses, backend by keyword only and its
values, a closed handle, headers it refuses, every dtype it has. Each test
compares the served call with the original on the same file (values,
strides, exception types). In CI the original is the stand-in in
fixtures/fake_safetensors; the GPU tier runs this file against the
installed library (GDSFS_REAL_SAFETENSORS=1)."""

import inspect
import json
import os
import struct
import unittest

import _autoload_support as S
from test_autoload import AutoloadCase

ALL = os.path.join(S.ST_FIXTURES, "all_dtypes.safetensors")


def minimal_file(tensors):
    """A safetensors file written by hand: {name: tensor} in name order."""
    import torch

    head, blobs, off = {}, [], 0
    from gdsfs.autoload._stformat import DTYPES

    names = {v[0]: k for k, v in DTYPES.items() if v[0]}
    for k in sorted(tensors):
        t = tensors[k]
        b = S.raw(t)
        head[k] = {"dtype": names[str(t.dtype).split(".")[-1]], "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    h = json.dumps(head).encode()
    h += b" " * (-len(h) % 8)
    assert torch  # the tensors are torch's
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


def every_dtype(torch):
    """A tensor of each safetensors dtype this torch has."""
    from gdsfs.autoload._stformat import DTYPES

    g = torch.Generator().manual_seed(29)
    out = {}
    for st, (name, bits) in sorted(DTYPES.items()):
        dt = getattr(torch, name, None) if name else None
        if dt is None:
            continue
        raw = torch.randint(0, 256, (6 * bits // 8,), generator=g, dtype=torch.uint8)
        if name == "bool":
            raw = raw % 2
        out["t_" + st] = raw.view(dt).reshape(2, 3)
    return out


class TestLibraryRules(AutoloadCase):
    def originals(self):
        import safetensors.torch as stt

        return stt.load_file, stt.load_file._gdsfs_original, self.st.safe_open, self.st.safe_open._gdsfs_original

    def takes_backend(self):
        return "backend" in inspect.signature(self.originals()[1]).parameters

    def assertSameDict(self, ours, theirs, what=""):
        try:
            want = theirs()
        except Exception as e:
            with self.assertRaises(type(e), msg=what):
                ours()
            return type(e)
        got = ours()
        self.assertEqual(list(got), list(want), what)
        for k in want:
            self.assertSameTensor(got[k], want[k], "%s %s" % (what, k))
        return None

    def test_pread_slices_are_the_librarys_copies(self):
        if not self.takes_backend():
            self.skipTest(S.loud("SKIPPED: this safetensors has no backend argument"))
        _, _, safe_open, orig = self.originals()
        mnt, src = self.put("pread/all.safetensors", ALL)
        with safe_open(mnt, framework="pt", device="cpu", backend="pread") as f, \
                self.original(orig, src, "pt", device="cpu", backend="pread") as o:
            for name in o.keys():
                sf, so = f.get_slice(name), o.get_slice(name)
                shape = so.get_shape()
                keys = []
                if len(shape) >= 1 and shape[0] > 1:
                    keys += [slice(None), slice(1, None), slice(0, 1), 0, -1]
                if len(shape) >= 2 and shape[1] > 2:
                    keys += [(slice(None), slice(1, 3)), (1, slice(0, 2)), (slice(0, 2), 1)]
                for key in keys:
                    self.assertSameOutcome(lambda: sf[key], lambda: so[key], "%s[%r]" % (name, key))
                    try:
                        got = so[key]
                    except Exception:
                        continue
                    self.assertTrue(sf[key].is_contiguous() and got.is_contiguous(), "%s[%r]" % (name, key))
                # Left to the library: a step, Ellipsis, a list.
                for key in (slice(0, 2, 2), Ellipsis, [0]):
                    self.assertSameOutcome(lambda: sf[key], lambda: so[key], "%s[%r]" % (name, key))
        self.assertEqual(self.A.served().get("safetensors.safe_open"), 1)
        self.assertEqual(set(self.A.fallbacks()), {"slice:pread"})
        self.assertEqual(self.mount.wait_leases(0), 0)

    def test_devices_the_library_refuses_are_refused(self):
        torch = self.torch
        load_file, orig_load, safe_open, orig_open = self.originals()
        mnt, src = self.put("dev/all.safetensors", ALL)
        for device in (torch.device("cpu"), "cpu:0", "CPU", -1, 1.0, "cuda:x"):
            with self.subTest(device=device):
                with self.assertRaises(Exception) as want:
                    self.original(orig_load, src, device=device)
                with self.assertRaises(type(want.exception)):
                    load_file(mnt, device=device)
                with self.assertRaises(Exception) as want:
                    self.original(orig_open, src, "pt", device=device)
                with self.assertRaises(type(want.exception)):
                    safe_open(mnt, "pt", device=device)
        self.assertEqual(self.A.served(), {})
        self.assertTrue(all(r.startswith("device:") for r in self.A.fallbacks()), self.A.fallbacks())
        self.assertEqual(self.mount.wait_leases(0), 0)

    def test_backend_is_keyword_only_and_checked(self):
        if not self.takes_backend():
            self.skipTest(S.loud("SKIPPED: this safetensors has no backend argument"))
        load_file, orig_load, safe_open, orig_open = self.originals()
        mnt, src = self.put("backend/all.safetensors", ALL)
        # Positional where the library takes it by keyword only: both refuse.
        self.assertSameDict(lambda: load_file(mnt, "cpu", "mmap"), lambda: self.original(orig_load, src, "cpu", "mmap"))
        for bad in ("bogus", "MMAP", 3):
            with self.subTest(backend=bad):
                with self.assertRaises(Exception) as want:
                    self.original(orig_load, src, backend=bad)
                with self.assertRaises(type(want.exception)):
                    load_file(mnt, backend=bad)
                with self.assertRaises(Exception) as want:
                    self.original(orig_open, src, "pt", backend=bad)
                with self.assertRaises(type(want.exception)):
                    safe_open(mnt, "pt", backend=bad)
        self.assertEqual(self.A.served(), {})
        self.assertEqual(self.mount.wait_leases(0), 0)

    def test_closed_handle(self):
        _, _, safe_open, orig = self.originals()
        mnt, src = self.put("closed/all.safetensors", ALL)
        with safe_open(mnt, framework="pt") as f, self.original(orig, src, "pt") as o:
            name = [k for k in o.keys() if o.get_slice(k).get_shape()][0]
            sf, so = f.get_slice(name), o.get_slice(name)
        for call in (lambda h: h.keys(), lambda h: h.metadata(), lambda h: h.get_tensor(name),
                     lambda h: h.get_slice(name)):
            with self.assertRaises(Exception) as want:
                call(o)
            self.assertIn("File is closed", str(want.exception))
            with self.assertRaises(type(want.exception)) as got:
                call(f)
            self.assertIn("File is closed", str(got.exception))
        # A slice taken before the close still reads, as the library's does.
        self.assertSameOutcome(lambda: sf[:1], lambda: so[:1], name)
        self.assertEqual(self.mount.wait_leases(0), 0)

    def test_headers_the_library_refuses(self):
        load_file, orig, _, _ = self.originals()
        f32 = struct.pack("<4f", 1, 2, 3, 4)

        def file(head, data=f32):
            h = json.dumps(head).encode()
            return struct.pack("<Q", len(h)) + h + data

        bad = {
            "overlap": {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                        "b": {"dtype": "F32", "shape": [3], "data_offsets": [4, 16]}},
            "hole": {"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                     "b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}},
            "size": {"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 16]}},
            "dtype": {"a": {"dtype": "F31", "shape": [4], "data_offsets": [0, 16]}},
            "short": {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}},
        }
        for what, head in bad.items():
            with self.subTest(header=what):
                mnt, src = self.put("hdr/%s.safetensors" % what, file(head))
                with self.assertRaises(Exception) as want:
                    self.original(orig, src)
                with self.assertRaises(type(want.exception)):
                    load_file(mnt)
        self.assertEqual(self.A.served(), {})
        self.assertTrue(all(r.startswith("format:") for r in self.A.fallbacks()), self.A.fallbacks())
        self.assertEqual(self.mount.wait_leases(0), 0)

    def test_every_dtype(self):
        """A file of every dtype the library and this torch have, written
        by hand and, where the library is installed, by its save_file."""
        load_file, orig, _, _ = self.originals()
        tensors = every_dtype(self.torch)
        for name in ("complex64", "float8_e8m0fnu"):
            if hasattr(self.torch, name):
                self.assertTrue(any(str(t.dtype) == "torch." + name for t in tensors.values()), name)
        files = {"minimal": minimal_file(tensors)}
        if self.real_st:
            from safetensors.torch import save

            files["library"] = save(tensors)
        for writer, data in files.items():
            with self.subTest(writer=writer):
                mnt, src = self.put("dtypes/%s.safetensors" % writer, data)
                got = load_file(mnt)
                self.assertSameDict(lambda: got, lambda: self.original(orig, src), writer)
                for k, t in tensors.items():
                    self.assertEqual(S.raw(got[k]), S.raw(t), k)
        self.assertEqual(self.A.served().get("safetensors.torch.load_file"), len(files))
        self.assertEqual(self.A.fallbacks(), {})
        self.assertEqual(self.mount.wait_leases(0), 0)


if __name__ == "__main__":
    unittest.main()
