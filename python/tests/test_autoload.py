"""gdsfs.autoload in this process, on real host-backend mounts: patched
safetensors and torch.load calls give what the original calls give (dtype,
shape, stride, bytes; for torch.load also the nesting, storage offsets and
which tensors share a storage), served from leases; fallbacks happen, are
counted by reason and logged once. Needs torch: fails in CI without it."""

import io
import json
import logging
import os
import shutil
import struct
import unittest

import _support
from _support import start_mount, Mount, require_mount
import _autoload_support as S


class AutoloadCase(unittest.TestCase):
    mount = None

    @classmethod
    def setUpClass(cls):
        S.require_torch(cls)
        require_mount(cls)
        import gdsfs.autoload as A

        A.enable()
        cls.A = A
        cls.st, cls.real_st = S.safetensors_lib()
        import safetensors.torch  # noqa: F401  (patched on import)
        import torch

        cls.torch = torch
        cls.mount = Mount(device="host")

    @classmethod
    def tearDownClass(cls):
        if cls.mount is not None:
            cls.mount.stop()
        import gdsfs
        import gdsfs.autoload as A

        A.disable()
        gdsfs.disconnect()

    def setUp(self):
        self.A.reset()

    def put(self, name, data_or_path):
        dst = os.path.join(self.mount.src, name)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        if isinstance(data_or_path, bytes):
            with open(dst, "wb") as f:
                f.write(data_or_path)
        else:
            shutil.copyfile(data_or_path, dst)
        os.chmod(dst, 0o644)
        return self.mount.path(name), dst

    def original(self, fn, *args, **kwargs):
        """fn (an original) as it runs for a fallback: the patched functions
        it calls pass straight through."""
        from gdsfs.autoload import _serve

        with _serve.bypass():
            return fn(*args, **kwargs)

    def assertSameOutcome(self, ours, theirs, what=""):
        """The same tensor, or the same exception type, from both calls."""
        try:
            want = theirs()
        except Exception as e:
            with self.assertRaises(type(e), msg=what):
                ours()
            return
        self.assertSameTensor(ours(), want, what)

    def assertSameTensor(self, got, want, what=""):
        self.assertEqual(S.describe(got), S.describe(want), what)


class TestSafetensors(AutoloadCase):
    def load_file(self):
        import safetensors.torch as stt

        self.assertTrue(hasattr(stt.load_file, "_gdsfs_original"), "load_file is not patched")
        return stt.load_file, stt.load_file._gdsfs_original

    def test_fixtures_written_by_library(self):
        k = S.known()
        writers = {f["writer"] for n, f in k["files"].items() if n != "unaligned.safetensors"}
        if S.REQUIRE_LIBRARY_FIXTURES:
            self.assertTrue(all(w.startswith("safetensors ") for w in writers), writers)
        elif not all(w.startswith("safetensors ") for w in writers):
            S.loud("NOTE: safetensors fixtures are from %s, not the library; regenerate with "
                   "scripts/make-safetensors-fixtures.py on the GPU machine" % sorted(writers))

    def test_load_file_equals_known_tensors_and_original(self):
        load_file, orig = self.load_file()
        torch = self.torch
        k = S.known()
        served = 0
        for name, f in sorted(k["files"].items()):
            with self.subTest(file=name):
                mnt, src = self.put(name, os.path.join(S.ST_FIXTURES, name))
                unknown = [t["dtype"] for t in f["tensors"].values()
                           if not hasattr(torch, _torch_name(t["dtype"]))]
                if unknown:
                    continue  # test_dtype_torch_lacks_falls_back
                got = load_file(mnt)
                served += 1
                self.assertEqual(sorted(got), sorted(f["tensors"]))
                for tname, t in f["tensors"].items():
                    g = got[tname]
                    self.assertEqual(str(g.dtype), "torch." + _torch_name(t["dtype"]), tname)
                    self.assertEqual(list(g.shape), t["shape"], tname)
                    self.assertTrue(g.is_contiguous(), tname)
                    self.assertEqual(S.sha(g), t["sha256"], tname)
                want = self.original(orig, src)
                self.assertEqual(list(got), list(want), "the order of the dict")
                for tname in want:
                    self.assertSameTensor(got[tname], want[tname], tname)
                # Owned by the caller: no tensor lies in a lease's mapping
                # (a memfd's); writing each leaves the lease's bytes as they
                # were (a second load has the file's bytes) and the second
                # load leaves the written tensors as they were.
                with open("/proc/self/maps") as m:
                    leased = [tuple(int(x, 16) for x in line.split()[0].split("-"))
                              for line in m if "/memfd:" in line]
                for tname, g in got.items():
                    if not g.numel():
                        continue
                    lo = g.data_ptr()
                    hi = lo + g.numel() * g.element_size()
                    inside = [(hex(a), hex(b)) for a, b in leased if lo < b and a < hi]
                    self.assertEqual(inside, [], "%s [%#x, %#x) lies in a lease's mapping" % (tname, lo, hi))
                    b = g.reshape(-1).view(torch.uint8)
                    b[0] = b[0] ^ 0xFF
                    self.assertNotEqual(S.sha(g), f["tensors"][tname]["sha256"], tname + ": the write did not take")
                written = {tname: S.sha(g) for tname, g in got.items()}
                again = load_file(mnt)
                served += 1
                for tname, t in f["tensors"].items():
                    self.assertEqual(S.sha(again[tname]), t["sha256"], tname + ": a write to the first load's tensor reached the lease")
                    self.assertEqual(S.sha(got[tname]), written[tname], tname + ": the second load wrote the first load's tensor")
        self.assertEqual(self.A.served().get("safetensors.torch.load_file"), served)
        self.assertEqual(self.A.fallbacks(), {})
        self.assertEqual(self.mount.wait_leases(0), 0)

    def test_dot_dot_after_a_link_loads_the_file_the_library_would(self):
        """load_file(link/../x.safetensors), link leading into another
        directory: the kernel's walk names that directory's parent's
        file, and so does the lease (not the file beside the link)."""
        load_file, orig = self.load_file()
        mine, other = (os.path.join(S.ST_FIXTURES, n) for n in ("nometa.safetensors", "newer.safetensors"))
        _, src = self.put("dd/sub/x.safetensors", mine)
        self.put("dd/x.safetensors", other)
        os.makedirs(os.path.join(self.mount.src, "dd", "sub", "deep"), exist_ok=True)
        if not os.path.islink(os.path.join(self.mount.src, "dd", "link")):
            os.symlink("sub/deep", os.path.join(self.mount.src, "dd", "link"))
        got = load_file(self.mount.path("dd/link") + "/../x.safetensors")
        want = self.original(orig, src)
        self.assertEqual(list(got), list(want))
        for tname in want:
            self.assertSameTensor(got[tname], want[tname], tname)
        self.assertEqual(self.A.served().get("safetensors.torch.load_file"), 1)

    def test_a_path_the_kernels_walk_fails_is_left_to_the_library(self):
        """A name missing before a `..` (whose text names a file that is
        there): no daemon is asked; the library raises what it raises,
        counted as path:ENOENT."""
        load_file, _ = self.load_file()
        self.put("dm/x.safetensors", os.path.join(S.ST_FIXTURES, "nometa.safetensors"))
        with self.assertRaises(FileNotFoundError):
            load_file(self.mount.path("dm") + "/missing/../x.safetensors")
        self.assertEqual(self.A.fallbacks(), {"path:ENOENT": 1})
        self.assertEqual(self.A.served(), {})

    def test_safe_open_api_equals_original(self):
        mnt, src = self.put("so/all.safetensors", os.path.join(S.ST_FIXTURES, "all_dtypes.safetensors"))
        safe_open = self.st.safe_open
        self.assertTrue(hasattr(safe_open, "_gdsfs_original"))
        orig = safe_open._gdsfs_original
        with safe_open(mnt, framework="pt", device="cpu") as f, self.original(orig, src, "pt", device="cpu") as o:
            self.assertEqual(f.keys(), o.keys())
            self.assertEqual(f.metadata(), o.metadata())
            if hasattr(o, "offset_keys"):
                self.assertEqual(f.offset_keys(), o.offset_keys())
            if hasattr(o, "get_tensors"):  # safetensors 0.8
                got, want = f.get_tensors(), o.get_tensors()
                self.assertEqual(list(got), list(want), "get_tensors() order")
                for name in want:
                    self.assertSameTensor(got[name], want[name], name)
            for name in o.keys():
                self.assertSameTensor(f.get_tensor(name), o.get_tensor(name), name)
                sf, so = f.get_slice(name), o.get_slice(name)
                self.assertEqual(sf.get_shape(), so.get_shape())
                self.assertEqual(sf.get_dtype(), so.get_dtype())
                shape = so.get_shape()
                keys = [slice(None)]
                if len(shape) >= 1 and shape[0] > 1:
                    keys += [slice(1, None), slice(0, 1), 0]
                if len(shape) >= 2 and shape[1] > 2:
                    keys += [(slice(None), slice(1, 3)), (slice(1, 2), slice(0, 2))]
                for key in keys:
                    self.assertSameOutcome(lambda: sf[key], lambda: so[key], "%s[%r]" % (name, key))
        self.assertEqual(self.A.served().get("safetensors.safe_open"), 1)
        self.assertEqual(self.A.fallbacks(), {})
        self.assertEqual(self.mount.wait_leases(0), 0)

    def test_unaligned_offsets(self):
        load_file, orig = self.load_file()
        mnt, src = self.put("un.safetensors", os.path.join(S.ST_FIXTURES, "unaligned.safetensors"))
        got, want = load_file(mnt), self.original(orig, src)
        for name in want:
            self.assertSameTensor(got[name], want[name], name)
        self.assertEqual(self.A.served().get("safetensors.torch.load_file"), 1)

    def test_dtype_torch_lacks_falls_back(self):
        load_file, orig = self.load_file()
        torch = self.torch
        if hasattr(torch, "uint16"):
            dt, data = "F6_E2M3", b"\0" * 3  # 4 elements of 6 bits: no torch has it
            shape = [4]
        else:
            dt, data, shape = "U16", b"\1\0\2\0", [2]
        head = json.dumps({"x": {"dtype": dt, "shape": shape, "data_offsets": [0, len(data)]}}).encode()
        mnt, src = self.put("newdtype.safetensors", struct.pack("<Q", len(head)) + head + data)
        with self.assertRaises(Exception) as want:
            self.original(orig, src)
        with self.assertRaises(type(want.exception)):
            load_file(mnt)
        reasons = list(self.A.fallbacks())
        self.assertEqual(len(reasons), 1, reasons)
        self.assertTrue(reasons[0] in ("dtype:" + dt, "format:dtype"), reasons)
        self.assertEqual(self.mount.wait_leases(0), 0)

    def test_backend_argument_is_served(self):
        """safetensors 0.8's load_file(..., backend=...) (how the library
        reads the file) is served where the library takes it; it fell back
        as an unknown argument."""
        import inspect

        load_file, orig = self.load_file()
        if "backend" not in inspect.signature(orig).parameters:
            self.skipTest("SKIPPED: this safetensors has no backend argument")
        mnt, src = self.put("backend.safetensors", os.path.join(S.ST_FIXTURES, "all_dtypes.safetensors"))
        for backend in ("mmap", "pread"):
            got, want = load_file(mnt, backend=backend), self.original(orig, src, backend=backend)
            self.assertEqual(list(got), list(want))
            for name in want:
                self.assertSameTensor(got[name], want[name], name)
        self.assertEqual(self.A.served().get("safetensors.torch.load_file"), 2)
        self.assertEqual(self.A.fallbacks(), {})

    def test_unknown_argument_falls_back_naming_it(self):
        # A keyword a newer library (or a caller like transformers) passes
        # that the patch does not know: the original runs, and the log
        # names the keyword so the fallback can be understood.
        load_file, orig = self.load_file()
        mnt, src = self.put("args.safetensors", os.path.join(S.ST_FIXTURES, "unaligned.safetensors"))
        with self.assertRaises(TypeError) as want:
            self.original(orig, src, device="cpu", novel_option=True)
        with self.assertLogs("gdsfs.autoload", "WARNING") as logs:
            with self.assertRaises(type(want.exception)):
                load_file(mnt, device="cpu", novel_option=True)
        self.assertEqual(list(self.A.fallbacks()), ["arguments"])
        self.assertIn("novel_option", "\n".join(logs.output))
        # It concerns a file under a mount: the daemon counts it too, also
        # for a fallback decided before any lease.
        _flush_reports(self)
        self.assertGreaterEqual((self.mount.stats().get("autoload_fallback_reasons") or {}).get("arguments", 0), 1)
        self.assertEqual(self.mount.wait_leases(0), 0)

    def test_transformers_5_call_is_served(self):
        # transformers 5.17 opens shards with safetensors 0.8's keyword
        # backend="mmap"; the patch fell back ("arguments") on it.
        mnt, src = self.put("tf5/model.safetensors", os.path.join(S.ST_FIXTURES, "all_dtypes.safetensors"))
        safe_open = self.st.safe_open
        orig = safe_open._gdsfs_original
        with safe_open(mnt, framework="pt", device="cpu", backend="mmap") as f, \
                self.original(orig, src, "pt", device="cpu", backend="mmap") as o:
            self.assertEqual(f.keys(), o.keys())
            for name in o.keys():
                self.assertSameTensor(f.get_tensor(name), o.get_tensor(name), name)
                self.assertSameOutcome(lambda: f.get_slice(name)[:], lambda: o.get_slice(name)[:], name)
        self.assertEqual(self.A.served().get("safetensors.safe_open"), 1)
        self.assertEqual(self.A.fallbacks(), {})
        self.assertEqual(self.mount.wait_leases(0), 0)

    def test_method_not_served_goes_to_the_library(self):
        # A method of a newer library that the served handle lacks is
        # answered by the library's own handle, counted (here and in the
        # daemon's stats), instead of an AttributeError in the caller.
        mnt, src = self.put("nm/a.safetensors", os.path.join(S.ST_FIXTURES, "all_dtypes.safetensors"))
        if not hasattr(self.st.safe_open._gdsfs_original(src, "pt"), "data_bytes"):
            self.skipTest(S.loud("SKIPPED: the real safetensors library has no stand-in method to try"))
        _flush_reports(self)
        before = self.mount.stats().get("autoload_fallback_reasons") or {}
        with self.st.safe_open(mnt, framework="pt") as f:
            name = next(iter(f.keys()))
            t = f.get_tensor(name)
            self.assertEqual(f.data_bytes(), self.st.safe_open._gdsfs_original(src, "pt").data_bytes())
            self.assertSameTensor(f.get_tensor(name), t, name)
        self.assertEqual(self.A.fallbacks(), {"method:data_bytes": 1})
        _flush_reports(self)
        after = self.mount.stats().get("autoload_fallback_reasons") or {}
        self.assertEqual(after.get("method:data_bytes", 0) - before.get("method:data_bytes", 0), 1, after)
        self.assertEqual(self.mount.wait_leases(0), 0)

    def test_not_safetensors_falls_back_with_the_original_error(self):
        load_file, orig = self.load_file()
        mnt, src = self.put("junk.safetensors", b"\xff" * 64)
        with self.assertRaises(Exception) as want:
            self.original(orig, src)
        with self.assertRaises(type(want.exception)):
            load_file(mnt)
        self.assertEqual(list(self.A.fallbacks()), ["format:header-size"])


class TestTorchLoad(AutoloadCase):
    def checkpoint(self):
        torch = self.torch
        g = torch.Generator().manual_seed(5)
        base = torch.randn(6, 8, generator=g)
        sd = {
            "w": base,
            "w_t": base.t(),  # a non-contiguous view of w's storage
            "w_rows": base[2:5],  # a view with a storage offset
            "w_cols": base[:, 1::3],  # strided
            "scalar": torch.tensor(3.25, dtype=torch.float64),
            "empty": torch.zeros(0, 5, dtype=torch.int32),
            "dtypes": [torch.arange(7, dtype=d) for d in
                       (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16)]
            + [torch.randn(5, generator=g).to(torch.bfloat16), torch.tensor([True, False, True]),
               torch.randn(3, generator=g, dtype=torch.float64), torch.randn(2, 2, generator=g).to(torch.complex64)],
            "nested": {"a": (torch.ones(2, 3)[:, 1], [torch.eye(3)]), "b": {"c": torch.full((4,), 7)}},
            "grad": torch.nn.Parameter(torch.randn(3, generator=g)),
            "n": 5, "s": "text",
        }
        sd["also_w"] = sd["w"]  # the same tensor twice
        return sd

    def compare(self, got, want):
        self.assertEqual(S.shape_of(got), S.shape_of(want))
        self.assertEqual(S.sharing(got), S.sharing(want))

    def test_equals_original(self):
        torch = self.torch
        load = torch.load
        self.assertTrue(hasattr(load, "_gdsfs_original"), "torch.load is not patched")
        orig = load._gdsfs_original
        mnt, src = self.put("ck/model.pt", b"")
        torch.save(self.checkpoint(), src)
        cases = [dict(), dict(map_location="cpu"), dict(map_location=torch.device("cpu")),
                 dict(map_location={"cpu": "cpu"}), dict(map_location=lambda s, loc: s),
                 dict(weights_only=True), dict(weights_only=True, map_location="cpu")]
        for kw in cases:
            with self.subTest(kw=kw):
                if kw.get("weights_only"):
                    ck = self.checkpoint()
                    del ck["grad"]  # Parameter is outside weights_only's allow-list on torch 1.13
                    torch.save(ck, src)
                got = load(mnt, **kw)
                want = orig(src, **kw)
                self.compare(got, want)
                with torch.no_grad():
                    for t in S.tensors_in(got):
                        if t.numel() and t.dtype != torch.bool:
                            t.add_(0)  # writable copies the caller owns
        self.assertEqual(self.A.served().get("torch.load"), len(cases))
        self.assertEqual(self.A.fallbacks(), {})
        self.assertEqual(self.mount.wait_leases(0), 0)

    def test_file_object(self):
        torch = self.torch
        mnt, src = self.put("ck/fobj.pt", b"")
        torch.save(self.checkpoint(), src)
        with open(mnt, "rb") as f:
            got = torch.load(f)
        with open(src, "rb") as f:
            want = torch.load._gdsfs_original(f)
        self.compare(got, want)
        self.assertEqual(self.A.served().get("torch.load"), 1)
        with open(src, "rb") as f:
            buf = io.BytesIO(f.read())
        self.compare(torch.load(buf), want)
        self.assertEqual(self.A.fallbacks(), {"not-a-path": 1})

    def test_file_object_of_a_replaced_file(self):
        """A file object opened before SOURCE's file was renamed over must
        not be served from the new file (the kernel may answer the path's
        stat from its cache while a lease by path holds the new file): it
        falls back, and the original reads the old file through the
        descriptor."""
        torch = self.torch
        mnt, src = self.put("ck/rep.pt", b"")
        torch.save({"who": "old"}, src)
        self.assertEqual(torch.load(mnt)["who"], "old")  # staged, its path looked up
        with open(mnt, "rb") as f:
            new = os.path.join(os.path.dirname(src), "rep.tmp")
            torch.save({"who": "new"}, new)
            os.rename(new, src)
            self.assertEqual(torch.load(f)["who"], "old")
        # Which check refuses it depends on whether the kernel has dropped
        # the path's cached entry yet (the daemon tells it in the
        # background): then the path no longer names the descriptor's
        # file (not-a-path); before, the daemon does (file-replaced).
        self.assertIn(self.A.fallbacks(), ({"file-replaced": 1}, {"not-a-path": 1}))
        self.assertEqual(torch.load(mnt)["who"], "new")

    def same_outcome(self, mnt, src, **kw):
        """torch.load of mnt gives what the original gives for src: the
        same objects, or an exception of the same type."""
        try:
            want = self.torch.load._gdsfs_original(src, **kw)
        except Exception as e:
            with self.assertRaises(type(e)):
                self.torch.load(mnt, **kw)
            return
        self.compare(self.torch.load(mnt, **kw), want)

    def test_bytes_before_the_archive(self):
        """Two archives written into one file, or bytes before one: zipfile
        finds the last archive's records where torch reads the first (or
        refuses the file); such files fall back."""
        torch = self.torch
        b = io.BytesIO()
        torch.save({"a": torch.ones(3)}, b)
        torch.save({"b": torch.zeros(4)}, b)
        one = io.BytesIO()
        torch.save({"c": torch.arange(5)}, one)
        for name, data in (("concat.pt", b.getvalue()), ("prefixed.pt", b"PK\x03\x04" + bytes(100) + one.getvalue())):
            with self.subTest(name):
                self.A.reset()
                mnt, src = self.put("ck/" + name, data)
                self.same_outcome(mnt, src)
                # Python 3.12's zipfile refuses some such files itself.
                self.assertIn(self.A.fallbacks(), ({"format:zip-prefix": 1}, {"format:not-zip": 1}))

    def test_central_directory_offset_out_of_the_file(self):
        """A central directory whose offset is past where it lies gives
        zipfile negative record offsets: the error is torch's RuntimeError,
        never a gdsfs ValueError."""
        torch = self.torch
        b = io.BytesIO()
        torch.save(self.checkpoint(), b)
        d = bytearray(b.getvalue())
        e = d.rfind(b"PK\x05\x06")
        off = struct.unpack_from("<I", d, e + 16)[0]
        if off != 0xFFFFFFFF:
            struct.pack_into("<I", d, e + 16, off + 64)
        z = d.rfind(b"PK\x06\x06")
        if z >= 0:
            struct.pack_into("<Q", d, z + 48, struct.unpack_from("<Q", d, z + 48)[0] + 64)
        mnt, src = self.put("ck/cdshift.pt", bytes(d))
        self.same_outcome(mnt, src)
        self.assertEqual(sum(self.A.fallbacks().values()), 1, self.A.fallbacks())

    def test_version_record(self):
        """The archive's version record is read: files torch refuses (no
        version, an unparsable or a newer one) are not loaded. Only the
        versions torch.save writes are served."""
        import zipfile

        torch = self.torch
        b = io.BytesIO()
        torch.save({"t": torch.arange(6.0)}, b)
        zin = zipfile.ZipFile(io.BytesIO(b.getvalue()))

        def rewrite(version):
            out = io.BytesIO()
            with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as zo:
                for i in zin.infolist():
                    data = zin.read(i.filename)
                    if i.filename.endswith("/version"):
                        if version is None:
                            continue
                        data = version
                    zo.writestr(i.filename, data)
            return out.getvalue()

        for version, reason in ((None, "format:no-version"), (b"99\n", "format:version"), (b"abc", "format:version"),
                                (b"3\n", None)):
            with self.subTest(version=version):
                self.A.reset()
                mnt, src = self.put("ck/version.pt", rewrite(version))
                self.same_outcome(mnt, src)
                self.assertEqual(self.A.fallbacks(), {reason: 1} if reason else {})

    def test_cpu_storages_go_through_torchs_restore(self):
        """CPU storages go through torch's restore function: deserializers
        registered for "cpu" run, and locations torch refuses ("cpu:0") are
        refused."""
        import torch.serialization as ser

        torch = self.torch
        mnt, src = self.put("ck/restore.pt", b"")
        torch.save({"a": torch.ones(3), "b": torch.arange(4)}, src)
        calls = []

        def deserialize(obj, location):
            if location.startswith("cpu"):
                calls.append(location)
            return None  # not handled here: torch's own deserializer follows

        ser.register_package(1, lambda obj: None, deserialize)
        try:
            for load, path in ((torch.load._gdsfs_original, src), (torch.load, mnt)):
                for kw in (dict(), dict(map_location="cpu"), dict(map_location=torch.device("cpu"))):
                    load(path, **kw)
            self.assertEqual(len(calls), 12, "the registered cpu deserializer ran %d times, want 6 each" % len(calls))
        finally:
            ser._package_registry[:] = [p for p in ser._package_registry if p[2] is not deserialize]
        for kw in (dict(map_location="cpu:0"), dict(map_location=torch.device("cpu", 0)),
                   dict(map_location={"cpu": torch.device("cpu")})):
            with self.subTest(kw=kw):
                self.same_outcome(mnt, src, **kw)

    def test_weights_only_keeps_its_safety(self):
        torch = self.torch
        mnt, src = self.put("ck/unsafe.pt", b"")
        torch.save({"f": _Boom(), "t": torch.ones(2)}, src)
        with self.assertRaises(Exception) as want:
            torch.load._gdsfs_original(src, weights_only=True)
        before = _Boom.calls
        with self.assertRaises(type(want.exception)):
            torch.load(mnt, weights_only=True)
        self.assertEqual(_Boom.calls, before, "weights_only=True ran code from the checkpoint")
        self.assertEqual(self.A.fallbacks(), {})

    def test_mmap(self):
        import inspect

        torch = self.torch
        mnt, src = self.put("ck/mmap.pt", b"")
        torch.save(self.checkpoint(), src)
        orig = torch.load._gdsfs_original
        if "mmap" not in inspect.signature(orig).parameters:
            # torch 1.13 has no mmap: the same error as the original.
            with self.assertRaises(Exception) as want:
                orig(src, mmap=True)
            with self.assertRaises(type(want.exception)):
                torch.load(mnt, mmap=True)
            return
        self.compare(torch.load(mnt, mmap=True), orig(src, mmap=True))
        self.assertEqual(self.A.served().get("torch.load"), 1)

    def test_zero_copy_views_hold_the_lease(self):
        torch = self.torch
        mnt, src = self.put("ck/zc.pt", b"")
        torch.save({"a": torch.arange(64.0), "b": torch.arange(10)}, src)
        os.environ["GDSFS_ZERO_COPY"] = "1"
        try:
            got = torch.load(mnt)
        finally:
            del os.environ["GDSFS_ZERO_COPY"]
        self.compare(got, torch.load._gdsfs_original(src))
        self.assertEqual(self.mount.leases_active(), 1, "zero-copy views must keep their lease")
        del got
        self.assertEqual(self.mount.wait_leases(0), 0)

    def test_legacy_format_falls_back(self):
        torch = self.torch
        mnt, src = self.put("ck/legacy.pt", b"")
        torch.save(self.checkpoint(), src, _use_new_zipfile_serialization=False)
        self.compare(torch.load(mnt), torch.load._gdsfs_original(src))
        self.assertEqual(self.A.fallbacks(), {"format:not-zip": 1})


class _Boom:
    calls = 0

    def __reduce__(self):
        return (_boom, ())


def _boom():
    _Boom.calls += 1
    return "boom"


def _torch_name(st_dtype):
    from gdsfs.autoload._stformat import DTYPES

    return DTYPES[st_dtype][0] or "none"


class TestFallbacks(AutoloadCase):
    """Fallbacks are counted by reason, logged once per reason, reported to
    the daemon where the call concerned a mount, and give the original's
    result."""

    def test_not_on_gdsfs(self):
        torch = self.torch
        _, src = self.put("fb/a.pt", b"")
        torch.save({"x": torch.arange(5)}, src)
        with self.assertLogs("gdsfs.autoload", level="WARNING") as logs:
            a = torch.load(src)
            b = torch.load(src)
        self.assertTrue(torch.equal(a["x"], b["x"]))
        self.assertEqual(self.A.fallbacks(), {"not-gdsfs": 2})
        self.assertEqual(len([r for r in logs.output if "not-gdsfs" in r]), 1, logs.output)

    def test_refused_file_is_counted_by_the_daemon(self):
        torch = self.torch
        m = start_mount(self, device="host", sets=["staging.capacity=1MiB"])
        src = os.path.join(m.src, "big.pt")
        torch.save({"x": torch.zeros(1 << 19)}, src)  # 2 MiB, more than the capacity
        got = torch.load(m.path("big.pt"))
        self.assertTrue(torch.equal(got["x"], torch.zeros(1 << 19)))
        reasons = self.A.fallbacks()
        self.assertEqual(len(reasons), 1, reasons)
        reason = next(iter(reasons))
        self.assertTrue(reason.startswith("refused:E"), reason)
        if _daemon_counts_reports():
            _flush_reports(self)
            st = m.stats()
            self.assertEqual(st.get("autoload_fallbacks"), 1, st)

    def test_stopped_daemon(self):
        torch = self.torch
        path, src = self.put("fb/b.pt", b"")
        torch.save({"x": torch.arange(3)}, src)
        dead = os.path.join(_support.tmpdir(), "dead.sock")
        os.environ["GDSFS_SOCKET"] = dead
        try:
            got = torch.load(path)
        finally:
            del os.environ["GDSFS_SOCKET"]
        self.assertTrue(torch.equal(got["x"], torch.arange(3)))
        self.assertEqual(self.A.fallbacks(), {"daemon-unavailable": 1})


class _HelloDaemon:
    """A daemon socket that answers hello naming a GPU device and every
    other request ok, recording the ops it was sent."""

    def __init__(self, devices, silent=False):
        import socket
        import threading

        self.devices, self.ops, self.silent = devices, [], silent
        self.path = os.path.join(_support.tmpdir(), "fake.sock")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(self.path)
        self.sock.listen(8)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            with c:
                buf = b""
                while True:
                    d = c.recv(65536)
                    if not d:
                        break
                    buf += d
                    while b"\n" in buf:
                        line, buf = buf.split(b"\n", 1)
                        req = json.loads(line)
                        self.ops.append(req.get("op"))
                        if self.silent and req.get("op") == "hello":
                            continue  # never answers it
                        ans = {"ok": True, "epoch": 1}
                        if req.get("op") == "hello":
                            ans.update(version=1, devices=self.devices)
                        c.sendall(json.dumps(ans).encode() + b"\n")

    def close(self):
        self.sock.close()


class TestCpuTargetOnAGpuMount(AutoloadCase):
    """A CPU load of a file on a GPU mount goes to the original loader
    (GDSFS_AUTOLOAD_CPU=original) without a lease: the daemon's hello says
    where it stages. A lease there would make the daemon stage the file
    from disk beside the original loader reading it, slowing a cold
    load."""

    def test_no_lease_for_a_cpu_load(self):
        src, _ = self.put("gpu-hello/nometa.safetensors", os.path.join(S.ST_FIXTURES, "nometa.safetensors"))
        fake = _HelloDaemon(["GPU-00000000-0000-0000-0000-000000000000"])
        os.environ["GDSFS_SOCKET"] = fake.path
        try:
            got = self.st.safe_open(src, framework="pt", device="cpu")
            keys = list(got.keys())
            again = self.st.safe_open(src, framework="pt", device="cpu")
        finally:
            del os.environ["GDSFS_SOCKET"]
            fake.close()
        with self.original(self.st.safe_open, src, framework="pt", device="cpu") as want:
            self.assertEqual(keys, list(want.keys()))
        del got, again
        self.assertEqual(self.A.fallbacks(), {"cpu-target-gpu-staged": 2})
        self.assertNotIn("acquire", fake.ops)
        self.assertEqual(fake.ops.count("hello"), 1, fake.ops)  # remembered for the directory
        self.assertEqual(fake.ops.count("report"), 2, fake.ops)

    def test_hello_without_an_answer_gives_no_shortcut(self):
        """A daemon that never answers hello, or answers nonsense, gives no
        shortcut and the load goes on without it (a malformed answer must
        not raise out of safe_open); it is asked again later, as it may
        answer then."""
        from gdsfs.autoload import _serve

        src, _ = self.put("no-hello/nometa.safetensors", os.path.join(S.ST_FIXTURES, "nometa.safetensors"))
        for fake in (_HelloDaemon(None, silent=True), _HelloDaemon({"x": 1}), _HelloDaemon([])):
            os.environ["GDSFS_SOCKET"] = fake.path
            old = _serve._HELLO_TIMEOUT
            _serve._HELLO_TIMEOUT = 0.2
            try:
                for _ in range(2):
                    self.assertIsNone(_serve.mount_is_gpu(src))
            finally:
                _serve._HELLO_TIMEOUT = old
                del os.environ["GDSFS_SOCKET"]
                fake.close()
            self.assertEqual(fake.ops.count("hello"), 2, fake.ops)

    def test_host_mount_still_serves_cpu_loads(self):
        path, _ = self.put("cpu/nometa.safetensors", os.path.join(S.ST_FIXTURES, "nometa.safetensors"))
        with self.st.safe_open(path, framework="pt", device="cpu") as f:
            for k in f.keys():
                f.get_tensor(k)
        self.assertEqual(self.A.fallbacks(), {})
        self.assertEqual(self.A.served().get("safetensors.safe_open"), 1, self.A.served())


def _flush_reports(tc):
    """Wait until the fallbacks reported so far reached their daemons."""
    from gdsfs.autoload import _report

    tc.assertTrue(_report.flush(60), "the fallback reports were not sent")


def _daemon_counts_reports():
    """The daemon built from this tree counts `report` requests once its
    protocol documents the op (the server side lands separately)."""
    p = os.path.join(_support.REPO, "proto", "PROTOCOL.md")
    try:
        with open(p) as f:
            return '"report"' in f.read()
    except OSError:
        return False


if __name__ == "__main__":
    logging.basicConfig()
    unittest.main()
