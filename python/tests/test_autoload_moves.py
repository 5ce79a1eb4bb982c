"""CPU tensors whose memory maps a file under a gdsfs mount, moved by
Tensor.to, .cuda and .copy_, on real host-backend mounts.

There is no GPU in CI: moves into CPU memory stand in for moves to a GPU
(_moves.TARGETS gets "cpu"; the host lease plays the GPU lease), so the
same code decides provenance from the memory, views the tensor in the
lease, checks the pages and the file, and counts. Every result is compared
with the plain call's (dtype, shape, strides, bytes). Needs torch: fails in
CI without it."""

import json
import os
import struct
import sys
import unittest

import _support
from _support import Mount, require_mount, start_mount
import _autoload_support as S

N = 4096  # float32 elements: 4 pages on 4 KiB-page machines


def _plain(fn):
    from gdsfs.autoload import _serve

    with _serve.bypass():
        return fn()


def _write(path, data):
    with open(path, "wb") as f:
        f.write(data)


def ctypes_array(addr, n):
    """n writable bytes at addr."""
    import ctypes

    return (ctypes.c_char * n).from_address(addr)


def write_safetensors(path, tensors):
    """A safetensors file of {name: CPU tensor} (header padded to 8 bytes,
    as the library writes it)."""
    import torch

    names = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.int64: "I64"}
    head, blobs, off = {}, [], 0
    for k, t in tensors.items():
        b = S.raw(t)
        head[k] = {"dtype": names[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(head, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def safetensors_cpu(path):
    """The tensors of a safetensors file as the library's CPU safe_open
    makes them: views of one private mapping of the whole file
    (UntypedStorage.from_file(shared=False), ByteStorage on torch 1.x)."""
    import torch

    size = os.path.getsize(path)
    if int(torch.__version__.split(".")[0]) >= 2:
        st = torch.UntypedStorage.from_file(path, shared=False, nbytes=size)
    else:
        st = torch.ByteStorage.from_file(path, shared=False, size=size)
    whole = torch.empty(0, dtype=torch.uint8).set_(st)
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        head = json.loads(f.read(n))
    dt = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "I64": torch.int64}
    out = {}
    for k, e in head.items():
        b, en = e["data_offsets"]
        out[k] = whole[8 + n + b:8 + n + en].view(dt[e["dtype"]]).reshape(e["shape"])
    return out


class MovesCase(unittest.TestCase):
    sets = ()

    @classmethod
    def setUpClass(cls):
        S.require_torch(cls)
        require_mount(cls)
        import gdsfs.autoload as A
        from gdsfs.autoload import _ahead, _maps, _moves

        A.enable()
        import numpy  # noqa: F401  (patched on import)
        import torch

        cls.A, cls.maps, cls.moves, cls.torch = A, _maps, _moves, torch
        cls.targets = _moves.TARGETS
        _moves.TARGETS = ("cuda", "cpu")
        # Leases taken ahead would change what these tests count; they are
        # tested on their own (test_autoload_kept.TestLeasesAhead).
        cls.ahead, _ahead.AHEAD = _ahead.AHEAD, 0
        cls.mount = Mount(device="host", sets=cls.sets)

    @classmethod
    def tearDownClass(cls):
        import gdsfs

        from gdsfs.autoload import _ahead

        cls.moves.TARGETS = cls.targets
        _ahead.AHEAD = cls.ahead
        cls.A.disable()
        cls.mount.stop()
        gdsfs.disconnect()

    def setUp(self):
        self.A.reset()

    def put(self, name, write):
        src = os.path.join(self.mount.src, name)
        write(src)
        return self.mount.path(name)

    def assertSame(self, got, want, what=""):
        self.assertEqual(S.describe(got), S.describe(want), what)

    def moves_of(self, t):
        """(name, move) pairs: every move the tests check, on t (2-D)."""
        torch = self.torch
        half = t.shape[0] // 2
        other = torch.float16 if t.dtype != torch.float16 else torch.float32
        out = [
            ("contiguous", lambda: t.to("cpu", copy=True)),
            ("dtype", lambda: t.to(other)),
            ("dtype-and-device", lambda: t.to("cpu", other)),
            ("like-tensor", lambda: t.to(torch.empty(0, dtype=other))),
            ("transpose", lambda: t.transpose(0, 1).to(copy=True)),
            ("t", lambda: t.t().to(other)),
            ("slice-step", lambda: t[1::2, 3:].to(copy=True)),
            ("view", lambda: t.view(-1)[5:].to(copy=True)),
            ("rank0-of-2", lambda: t.narrow(0, 0, half).to(copy=True)),
            ("rank1-of-2", lambda: t.narrow(0, half, half).to(copy=True)),
            ("rank1-of-2-cols", lambda: t.narrow(1, t.shape[1] // 2, t.shape[1] // 2).to(copy=True)),
        ]
        for name, dst_dtype in (("into-slice", t.dtype), ("into-slice-dtype", other)):
            def into(dst_dtype=dst_dtype):
                dst = torch.zeros(t.shape[0] + 3, t.shape[1] + 5, dtype=dst_dtype)
                dst[2:2 + t.shape[0], 1:1 + t.shape[1]].copy_(t)
                return dst
            out.append((name, into))

        def into_view():
            dst = torch.zeros(t.shape[1], t.shape[0], dtype=t.dtype)
            dst.t().copy_(t)
            return dst
        out.append(("into-transposed-view", into_view))
        return out

    def check_all_served(self, t, what):
        for name, move in self.moves_of(t):
            with self.subTest(source=what, move=name):
                before = sum(self.A.served().values())
                want = _plain(move)
                got = move()
                self.assertSame(got, want)
                self.assertEqual(sum(self.A.served().values()), before + 1, "not served: %s" % self.A.fallbacks())
        self.assertEqual(self.A.fallbacks(), {})


class TestServedMoves(MovesCase):
    def test_safetensors_mapping(self):
        torch = self.torch
        g = torch.Generator().manual_seed(1)
        ts = {"w": torch.randn(64, 48, generator=g), "h": torch.randn(32, 16, generator=g).half(),
              "b": torch.randn(16, 8, generator=g).bfloat16(), "i": torch.arange(96).reshape(12, 8)}
        p = self.put("m.safetensors", lambda d: write_safetensors(d, ts))
        got = safetensors_cpu(p)
        for k, t in got.items():
            self.assertTrue(torch.equal(t, ts[k]), k)
            if k == "i":
                continue  # integers: test_integer_conversion_is_not_served
            self.check_all_served(t, "safetensors:" + k)

    def test_numpy_mmap(self):
        import numpy as np

        torch = self.torch
        a = np.random.default_rng(2).standard_normal((80, 40)).astype(np.float32)
        p = self.put("a.npy", lambda d: np.save(d, a))
        arr = np.load(p, mmap_mode="r")
        t = torch.from_numpy(arr)
        self.assertTrue(torch.equal(t, torch.from_numpy(a)))
        self.check_all_served(t, "np.load")

    def test_numpy_memmap_not_element_aligned(self):
        import numpy as np

        torch = self.torch
        a = np.random.default_rng(4).standard_normal((30, 20)).astype(np.float32)
        p = self.put("odd.bin", lambda d: _write(d, b"\x07" + a.tobytes()))
        t = torch.from_numpy(np.memmap(p, dtype=np.float32, mode="r", offset=1, shape=a.shape))
        self.assertTrue(torch.equal(t, torch.from_numpy(a)))
        self.check_all_served(t, "np.memmap at offset 1")

    def test_torch_from_file(self):
        torch = self.torch
        x = torch.randn(60, 50, generator=torch.Generator().manual_seed(3))
        p = self.put("x.bin", lambda d: _write(d, S.raw(x)))
        t = torch.from_file(p, shared=False, size=x.numel(), dtype=torch.float32).view(60, 50)
        self.assertTrue(torch.equal(t, x))
        self.check_all_served(t, "torch.from_file")

    def test_torch_load_mmap(self):
        import inspect

        torch = self.torch
        if "mmap" not in inspect.signature(torch.load._gdsfs_original).parameters:
            self.skipTest(_support.loud("SKIPPED: torch %s has no torch.load(mmap=True) (torch 2.1 added it); "
                                        "that source is not checked with this torch" % torch.__version__))
        x = torch.randn(40, 30, generator=torch.Generator().manual_seed(4))
        p = self.put("c.pt", lambda d: torch.save({"x": x}, d))
        # the library's own mapping of the file (the patched torch.load
        # would serve this call from the lease instead)
        t = _plain(lambda: torch.load._gdsfs_original(p, mmap=True))["x"]
        self.assertTrue(torch.equal(t, x))
        self.check_all_served(t, "torch.load(mmap=True)")

    def test_module_load_state_dict(self):
        torch = self.torch
        lin = torch.nn.Linear(24, 16)
        sd = {k: v.detach().clone() for k, v in lin.state_dict().items()}
        p = self.put("lin.safetensors", lambda d: write_safetensors(d, sd))
        fresh = torch.nn.Linear(24, 16)
        fresh.load_state_dict(safetensors_cpu(p))
        for k, v in fresh.state_dict().items():
            self.assertTrue(torch.equal(v, sd[k]), k)
        self.assertEqual(self.A.served().get("torch.Tensor.copy_"), 2, self.A.served())


class TestPagemap(unittest.TestCase):
    def test_written_pages_of_a_private_mapping(self):
        """Every way of finding them (PAGEMAP_SCAN; reading the flags of a
        few pages, of many pages) counts the written pages and only
        those."""
        from gdsfs.autoload import _maps

        self._written_pages()
        if not _maps.scan_ok:
            print("SKIPPED: PAGEMAP_SCAN (Linux 6.7): not answered by this kernel; the pagemap read was checked",
                  file=sys.stderr)
            return
        _maps.scan_ok = False
        try:
            self._written_pages()
        finally:
            _maps.scan_ok = True

    def _written_pages(self):
        import ctypes
        import mmap

        S.require_torch(self)
        from gdsfs.autoload import _maps

        page, n = _maps.PAGE, 2048
        p = os.path.join(_support.tmpdir(), "priv.bin")
        _write(p, b"\1" * (page * n))
        with open(p, "rb") as f:
            m = mmap.mmap(f.fileno(), page * n, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        try:
            buf = (ctypes.c_char * (page * n)).from_buffer(m)
            lo = ctypes.addressof(buf)
            _ = bytes(m[:page * n:page])  # every page read: the file's pages, present
            self.assertEqual(_maps.written_pages(lo, lo + page * n), 0)
            m[5 * page] = 7
            m[1500 * page + 9] = 7
            self.assertEqual(_maps.written_pages(lo, lo + page * n), 2)  # many pages
            self.assertEqual(_maps.written_pages(lo, lo + 8 * page), 1)  # a few
            self.assertEqual(_maps.written_pages(lo + 6 * page, lo + 1500 * page), 0)
            del buf
        finally:
            m.close()


class TestVmaAt(unittest.TestCase):
    def test_the_mapping_at_an_address(self):
        """vma_at says which file, from which offset, shared or private, is
        mapped at an address, by the ioctl and by /proc/self/maps alike."""
        import mmap

        import numpy as np

        from gdsfs.autoload import _maps

        page = _maps.PAGE
        p = os.path.join(_support.tmpdir(), "vma.bin")
        _write(p, b"\1" * (8 * page))
        st = os.stat(p)
        self.addCleanup(setattr, _maps, "query_ok", _maps.query_ok)
        with open(p, "r+b") as f:
            sh = mmap.mmap(f.fileno(), 4 * page, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ, offset=2 * page)
            pr = mmap.mmap(f.fileno(), 2 * page, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        try:
            b_sh, b_pr = np.frombuffer(sh, dtype=np.uint8), np.frombuffer(pr, dtype=np.uint8)
            at_sh, at_pr = b_sh.ctypes.data, b_pr.ctypes.data
            ways = ["ioctl", "maps"]
            if not _maps.query_ok:
                ways.remove("ioctl")
                print(_support.loud("SKIPPED: this kernel refuses ioctl(PROCMAP_QUERY): only /proc/self/maps checked"))
            for way in ways:
                _maps.query_ok = way == "ioctl"
                with self.subTest(way=way):
                    v = _maps.vma_at(at_sh + page + 5, st.st_dev)
                    self.assertEqual((v.start, v.end, v.offset, v.key, v.shared, v.writable),
                                     (at_sh, at_sh + 4 * page, 2 * page, (st.st_dev, st.st_ino), True, False))
                    v = _maps.vma_at(at_pr, st.st_dev)
                    self.assertEqual((v.start, v.end, v.offset, v.key, v.shared, v.writable),
                                     (at_pr, at_pr + 2 * page, 0, (st.st_dev, st.st_ino), False, True))
                    self.assertEqual(_maps.query_ok, way == "ioctl")
            del b_sh, b_pr
        finally:
            sh.close()
            pr.close()


class TestParseMaps(unittest.TestCase):
    def test_a_dropped_directory_entry_keeps_its_path(self):
        """The kernel names a mapped file whose directory entry was dropped
        (on a FUSE mount: looked up again) "PATH (deleted)": the entry holds
        PATH, which (dev, ino) checks wherever it is used."""
        from gdsfs.autoload import _maps

        dev = os.makedev(0, 0x3a)
        data = (b"7f0000000000-7f0000004000 r--s 00002000 00:3a 1234    /m/a.bin (deleted)\n"
                b"7f0000004000-7f0000005000 rw-p 00000000 00:3a 1235    /m/b (deleted).bin\n")
        got = [(e.start, e.end, e.offset, e.key, e.path, e.shared, e.writable) for e in _maps.parse_maps(data, {dev})]
        self.assertEqual(got, [(0x7f0000000000, 0x7f0000004000, 0x2000, (dev, 1234), "/m/a.bin", True, False),
                               (0x7f0000004000, 0x7f0000005000, 0, (dev, 1235), "/m/b (deleted).bin", False, True)])


class TestTargets(unittest.TestCase):
    """Which calls name a GPU move that is served (no CUDA needed to
    decide): the CUDA path itself runs on the GPU machine only."""

    def test_calls(self):
        S.require_torch(self)
        import torch

        from gdsfs.autoload import _moves
        from gdsfs.autoload._serve import Fallback

        self.assertEqual(_moves.TARGETS, ("cuda",))
        t = torch.arange(12, dtype=torch.float32).reshape(3, 4)
        served = [
            (_moves._to_target, (torch, t, ("cuda:1",), {})),
            (_moves._to_target, (torch, t, (torch.device("cuda", 0), torch.float16), {"non_blocking": True})),
            (_moves._to_target, (torch, t, (), {"device": "cuda:0", "dtype": torch.bfloat16, "copy": True})),
            (_moves._to_target, (torch, t, (), {"device": "cuda:0", "memory_format": torch.contiguous_format})),
            (_moves._cuda_target, (torch, t, (1,), {})),
            (_moves._cuda_target, (torch, t, ("cuda:0", True), {})),
            (_moves._cuda_target, (torch, t, (), {"device": torch.device("cuda", 2), "non_blocking": False})),
        ]
        for fn, args in served:
            with self.subTest(fn=fn.__name__, args=args[2:]):
                self.assertIsNotNone(fn(*args))
        not_served = [
            (_moves._to_target, (torch, t, ("cpu",), {})),
            (_moves._to_target, (torch, t, (torch.float64,), {})),
            (_moves._to_target, (torch, t, ("meta",), {})),
            (_moves._cuda_target, (torch, t, (), {"unknown": 1})),
        ]
        for fn, args in not_served:
            with self.subTest(fn=fn.__name__, args=args[2:]):
                self.assertIsNone(fn(*args))
        self.assertIsNone(_moves._to_target(torch, t, ("cuda:0", "nonsense"), {}))  # the original raises
        for fn, args in ((_moves._to_target, (torch, t, ("cuda:0", torch.int32), {})),
                         (_moves._to_target, (torch, t.long(), ("cuda:0", torch.float32), {}))):
            with self.subTest(conversion=args[2]), self.assertRaises(Fallback) as cm:
                fn(*args)
            self.assertEqual(cm.exception.reason, "dtype-conversion")
        g = t.clone().requires_grad_()
        with self.assertRaises(Fallback) as cm:
            _moves._to_target(torch, g, ("cuda:0",), {})
        self.assertEqual(cm.exception.reason, "requires-grad")
        with torch.no_grad():
            self.assertIsNotNone(_moves._to_target(torch, g, ("cuda:0",), {}))


class TestLeases(MovesCase):
    def test_lease_kept_across_mappings(self):
        """One lease serves every move out of a file, and is kept once the
        file is no longer mapped: the next mapping of it is served from the
        same lease. release() ends the kept leases."""
        import gc

        import numpy as np

        torch = self.torch
        self.moves.release()
        m = start_mount(self, device="host")
        for name in ("k1.npy", "k2.npy"):
            np.save(os.path.join(m.src, name), np.arange(64, dtype=np.float32))
        t = torch.from_numpy(np.load(m.path("k1.npy"), mmap_mode="r"))
        t.to(torch.float64)
        t[1:].to(torch.float16)
        self.assertEqual(m.wait_leases(1), 1)
        ids = [k.lease.id for k in self.moves._leases.values()]
        del t
        gc.collect()
        u = torch.from_numpy(np.load(m.path("k2.npy"), mmap_mode="r"))
        self.assertSame(u.to(torch.float64), _plain(lambda: u.to(torch.float64)))
        self.assertEqual(m.wait_leases(2), 2)
        t = torch.from_numpy(np.load(m.path("k1.npy"), mmap_mode="r"))
        self.assertSame(t.to(torch.float64), _plain(lambda: t.to(torch.float64)))
        self.assertEqual(self.A.served(), {"torch.Tensor.to": 4})
        self.assertEqual([k.lease.id for k in self.moves._leases.values()][-1:], ids)
        self.moves.release()
        self.assertEqual(m.wait_leases(0), 0)


class TestPagemapAfterFork(unittest.TestCase):
    def test_a_forked_child_reads_its_own_pagemap(self):
        """The kept /proc/self/pagemap descriptor is the opener's page
        tables: a forked child opens its own, and sees the pages it wrote."""
        import ctypes
        import mmap

        from gdsfs.autoload import _maps

        p = os.path.join(_support.tmpdir(), "pm.bin")
        _write(p, b"\0" * (4 * _maps.PAGE))
        with open(p, "rb") as f:
            m = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        lo = ctypes.addressof(ctypes.c_char.from_buffer(m))
        hi = lo + len(m)
        self.assertEqual(_maps.written_pages(lo, hi), 0)  # the parent's descriptor is open now
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                m[0] = 1
                m[2 * _maps.PAGE] = 1
                code = 0 if _maps.written_pages(lo, hi) == 2 else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        self.assertEqual(os.waitstatus_to_exitcode(status), 0, "the child counted other than its 2 written pages")
        self.assertEqual(_maps.written_pages(lo, hi), 0)


class TestFallbacks(MovesCase):
    sets = ("fuse.attr_timeout=0s", "fuse.entry_timeout=0s", "fuse.read_only=false")

    def test_written_private_pages_are_not_served(self):
        torch = self.torch
        x = torch.arange(N, dtype=torch.float32)
        p = self.put("w.bin", lambda d: _write(d, S.raw(x)))
        t = torch.from_file(p, shared=False, size=N, dtype=torch.float32)
        page = os.sysconf("SC_PAGE_SIZE") // 4
        t[3] = -1.0  # the first page is this process's own now, not the file's
        got = t.to("cpu", copy=True)
        self.assertEqual(got[3].item(), -1.0)
        self.assertSame(got, _plain(lambda: t.to("cpu", copy=True)))
        self.assertEqual(self.A.fallbacks(), {"private-pages-written": 1})
        self.assertEqual(self.A.served(), {})
        # pages the tensor covers that were not written are still the file's
        rest = t[page:].to("cpu", copy=True)
        self.assertTrue(torch.equal(rest, x[page:]))
        self.assertEqual(self.A.served(), {"torch.Tensor.to": 1})
        dst = torch.zeros(8)
        dst.copy_(t[:8])
        self.assertEqual(dst[3].item(), -1.0)
        self.assertEqual(self.A.fallbacks(), {"private-pages-written": 2})

    def test_changed_file_is_not_served(self):
        import numpy as np

        torch = self.torch
        p = self.put("ch.npy", lambda d: np.save(d, np.arange(1000, dtype=np.float32)))
        t = torch.from_numpy(np.load(p, mmap_mode="r"))
        self.assertSame(t.to(torch.float64), _plain(lambda: t.to(torch.float64)))
        self.assertEqual(self.A.served(), {"torch.Tensor.to": 1})
        np.save(os.path.join(self.mount.src, "ch.npy"), np.arange(2000, dtype=np.float32))
        # An open through the mount tells the kernel of the new version
        # before it returns; without one the kernel hears of it when the
        # daemon has handled SOURCE's change event, a moment later.
        open(p, "rb").close()
        got = t.to(torch.float64)
        self.assertSame(got, _plain(lambda: t.to(torch.float64)))
        self.assertEqual(self.A.fallbacks(), {"file-changed": 1})
        self.assertEqual(self.A.served(), {"torch.Tensor.to": 1})
        # mapped again: the new version is served, to the new mapping and
        # the old one alike (both show the file's pages now)
        t2 = torch.from_numpy(np.load(p, mmap_mode="r"))
        self.assertSame(t2.to(torch.float64), _plain(lambda: t2.to(torch.float64)))
        self.assertSame(t.to(torch.float64), _plain(lambda: t.to(torch.float64)))
        self.assertEqual(self.A.served(), {"torch.Tensor.to": 3})

    def test_shared_writable_mapping_is_not_served(self):
        import numpy as np

        torch = self.torch
        p = self.put("rw.npy", lambda d: np.save(d, np.arange(100, dtype=np.float32)))
        t = torch.from_numpy(np.load(p, mmap_mode="r+"))
        self.assertSame(t.to(torch.float16), _plain(lambda: t.to(torch.float16)))
        self.assertEqual(self.A.fallbacks(), {"mapping-shared-writable": 1})

    def remap_fixed(self, t, path, offset, private):
        """Maps path's bytes from offset over t's whole mapping, at the same
        address and length (mmap MAP_FIXED): /proc/self/map_files still
        names path for that range."""
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
        e = self.maps.find(t.data_ptr())
        self.assertIsNotNone(e, "the mapping is not indexed")
        prot, flags = (3, 0x02) if private else (1, 0x01)  # PROT_READ|PROT_WRITE, MAP_PRIVATE; PROT_READ, MAP_SHARED
        fd = os.open(path, os.O_RDWR if private else os.O_RDONLY)
        try:
            got = libc.mmap(e.start, e.end - e.start, prot, flags | 0x10, fd, offset)  # MAP_FIXED
        finally:
            os.close(fd)
        self.assertEqual(got, e.start, "mmap MAP_FIXED: errno %d" % ctypes.get_errno())

    def test_mapping_replaced_by_another_part_of_the_file_is_not_served_stale(self):
        import numpy as np

        torch = self.torch
        half = 4 * os.sysconf("SC_PAGE_SIZE")
        p = self.put("fixed.bin", lambda d: _write(d, S.raw(torch.arange(2 * half // 4, dtype=torch.float32))))
        t = torch.from_numpy(np.memmap(p, dtype=np.float32, mode="r", shape=(half // 4,)))
        self.assertSame(t.to(torch.float64), _plain(lambda: t.to(torch.float64)))
        self.remap_fixed(t, p, half, private=False)  # the file's second half, where its first was
        self.assertSame(t.to(torch.float64), _plain(lambda: t.to(torch.float64)))

    def test_mapping_replaced_by_a_written_private_one_is_not_served_stale(self):
        import numpy as np

        torch = self.torch
        n = os.sysconf("SC_PAGE_SIZE")  # float32 elements: 4 pages
        p = self.put("fixedp.bin", lambda d: _write(d, S.raw(torch.arange(n, dtype=torch.float32))))
        t = torch.from_numpy(np.memmap(p, dtype=np.float32, mode="r", shape=(n,)))
        self.assertSame(t.to(torch.float64), _plain(lambda: t.to(torch.float64)))
        self.remap_fixed(t, p, 0, private=True)  # the same bytes, now private and writable
        torch.from_numpy(np.frombuffer((ctypes_array(t.data_ptr(), 4 * n)), dtype=np.float32))[3] = -1.0
        self.assertEqual(_plain(lambda: t.to(torch.float64))[3].item(), -1.0)
        self.assertSame(t.to(torch.float64), _plain(lambda: t.to(torch.float64)))

    def test_replaced_mappings_are_not_served_stale_without_procmap_query(self):
        """Where the kernel has no ioctl(PROCMAP_QUERY) (before Linux 6.11),
        /proc/self/maps, read whole, decides the same way."""
        self.addCleanup(setattr, self.maps, "query_ok", self.maps.query_ok)
        self.maps.query_ok = False
        self.test_mapping_replaced_by_another_part_of_the_file_is_not_served_stale()
        self.test_mapping_replaced_by_a_written_private_one_is_not_served_stale()
        self.assertFalse(self.maps.query_ok)

    def assert_original_move(self, t, move):
        """move(t) ran the original call: without CUDA it raised as the
        original does; with CUDA its result equals the plain move of a
        copy of t that no mapping backs."""
        torch = self.torch
        if not torch.cuda.is_available():
            with self.assertRaises(Exception):  # the original call ran, and raised
                move(t)
            return
        got = move(t)
        want = move(t.clone())
        self.assertEqual((got.dtype, got.shape, got.stride()), (want.dtype, want.shape, want.stride()))
        self.assertTrue(torch.equal(got.cpu(), want.cpu()))

    def test_integer_conversion_is_not_served(self):
        """Conversions on the GPU are served between floating types only:
        plain moves convert integers on the CPU (overflow differs)."""
        import numpy as np

        torch = self.torch
        p = self.put("i.npy", lambda d: np.save(d, np.arange(100, dtype=np.int64)))
        t = torch.from_numpy(np.load(p, mmap_mode="r"))
        self.moves.TARGETS = ("cuda",)
        try:
            self.assert_original_move(t, lambda x: x.to("cuda:0", torch.float32))
        finally:
            self.moves.TARGETS = ("cuda", "cpu")
        self.assertEqual(self.A.fallbacks(), {"dtype-conversion": 1})

    def test_gpu_move_from_a_host_mount_takes_no_lease(self):
        """Bytes staged in host memory are no faster to copy to a GPU than
        the mapping: the move is the original's, without a lease (which
        would stage the file)."""
        import numpy as np

        torch = self.torch
        p = self.put("h.npy", lambda d: np.save(d, np.arange(100, dtype=np.float32)))
        t = torch.from_numpy(np.load(p, mmap_mode="r"))
        self.maps.refresh()  # ends the kept leases of earlier tests' mappings now
        kept = self.moves.leases_kept()
        self.moves.TARGETS = ("cuda",)
        try:
            self.assert_original_move(t, lambda x: x.to("cuda:0"))
        finally:
            self.moves.TARGETS = ("cuda", "cpu")
        self.assertEqual(self.A.fallbacks(), {"host-staged": 1})
        self.assertEqual(self.moves.leases_kept(), kept)

    def test_refused_file_is_counted_by_the_daemon(self):
        import numpy as np

        torch = self.torch
        m = start_mount(self, device="host", sets=["staging.capacity=1MiB"])
        src = os.path.join(m.src, "big.npy")
        np.save(src, np.ones(1 << 19, dtype=np.float32))  # 2 MiB, more than the capacity
        t = torch.from_numpy(np.load(m.path("big.npy"), mmap_mode="r"))
        got = t.to(torch.float16)
        self.assertTrue(torch.equal(got, torch.ones(1 << 19, dtype=torch.float16)))
        reasons = self.A.fallbacks()
        self.assertEqual(len(reasons), 1, reasons)
        self.assertTrue(next(iter(reasons)).startswith("refused:E"), reasons)
        from gdsfs.autoload import _report

        self.assertTrue(_report.flush(60))
        st = m.stats()
        self.assertEqual(st.get("autoload_fallbacks"), 1, st)
        self.assertEqual(sum(st.get("autoload_fallback_reasons", {}).values()), 1, st)
        del t


class TestForkAndRun(MovesCase):
    def test_forked_child_leases_its_own(self):
        """A forked child (a DataLoader worker) does not use or end the
        parent's kept leases: it takes its own."""
        import numpy as np

        torch = self.torch
        p = self.put("fork.npy", lambda d: np.save(d, np.arange(256, dtype=np.float32)))
        t = torch.from_numpy(np.load(p, mmap_mode="r"))
        t.to(torch.float64)
        kept = self.moves.leases_kept()
        ids = sorted(k.lease.id for k in self.moves._leases.values())
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report and leave without running the parent's cleanups
            try:
                ok = torch.equal(t.to(torch.float64), torch.arange(256, dtype=torch.float64))
                theirs = sorted(k.lease.id for k in self.moves._leases.values())
                msg = "%s %d %s %s" % (ok, self.moves.leases_kept(), self.A.served(), theirs == ids)
            except BaseException as e:
                msg = "error %r" % e
            os.write(w, msg.encode())
            os._exit(0)
        os.close(w)
        with os.fdopen(r, "rb") as f:
            got = f.read().decode()
        os.waitpid(pid, 0)
        self.assertEqual(got, "True 1 {'torch.Tensor.to': 2} False")
        self.assertEqual(self.moves.leases_kept(), kept)
        self.assertEqual(self.A.served(), {"torch.Tensor.to": 1})

    def test_gdsfs_run_installs_the_wrappers(self):
        bin_, why = _support.gdsfs_bin()
        if why:
            self.skipTest(_support.loud("SKIPPED: " + why))
        import subprocess
        import sys

        env = {k: v for k, v in os.environ.items() if not k.startswith(("GDSFS_", "PYTHONPATH"))}
        code = ("import numpy, torch; print(hasattr(torch.Tensor.to, '_gdsfs_original'), "
                "hasattr(torch.Tensor.copy_, '_gdsfs_original'), hasattr(numpy.memmap.__new__, '_gdsfs_original'))")
        r = subprocess.run([bin_, "run", "--", sys.executable, "-c", code], env=env, cwd="/",
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=300)
        self.assertEqual(r.returncode, 0, r.stderr.decode(errors="replace"))
        self.assertEqual(r.stdout.decode().split(), ["True", "True", "True"])


class TestFastPath(MovesCase):
    def test_tensors_not_from_a_mount_never_read_proc(self):
        """With gdsfs mappings in the index, moves of other tensors are a
        bisect: no rebuild of the index, nothing served or counted."""
        import numpy as np

        torch = self.torch
        p = self.put("f.npy", lambda d: np.save(d, np.arange(64, dtype=np.float32)))
        mapped = torch.from_numpy(np.load(p, mmap_mode="r"))
        mapped.to(torch.float64)  # served: np.memmap indexed its mapping
        self.assertIn(p, [e.path for e in self.maps.entries()])
        before = self.maps.refreshes
        small = torch.arange(1000, dtype=torch.float32)
        dst = torch.empty(1000, dtype=torch.float64)
        for _ in range(2000):
            small.to(torch.float64)
            small[::2].to(torch.float16)
            dst.copy_(small)
        self.assertEqual(self.maps.refreshes, before)
        self.assertEqual(self.A.fallbacks(), {})
        self.assertEqual(self.A.served(), {"torch.Tensor.to": 1})

    def test_tensors_outside_the_mappings_never_reach_the_decision(self):
        """Memory outside the span of the index's mappings costs one
        comparison: the moves of such tensors never get to _try."""
        import numpy as np

        torch = self.torch
        p = self.put("h.npy", lambda d: np.save(d, np.arange(64, dtype=np.float32)))
        mapped = torch.from_numpy(np.load(p, mmap_mode="r"))
        self.assertIn(p, [e.path for e in self.maps.entries()])
        self.maps.discover_at = float("inf")  # a rebuild is not due
        tried = []
        orig = self.moves._try
        self.moves._try = lambda *a: tried.append(a[1]) or orig(*a)
        try:
            small = torch.arange(1000, dtype=torch.float32)
            dst = torch.empty(1000, dtype=torch.float64)
            es = self.maps.entries()
            self.assertFalse(es[0].start <= small.data_ptr() < es[-1].end, "the test's tensor lies among the mappings")
            for _ in range(10):
                small.to(torch.float64)
                dst.copy_(small)
            self.assertEqual(tried, [])
            mapped.to(torch.float64)
            self.assertEqual(tried, ["torch.Tensor.to"])
        finally:
            self.moves._try = orig

    def test_a_hooked_mapping_is_indexed_without_reading_the_maps(self):
        import numpy as np

        torch = self.torch
        p = self.put("g.npy", lambda d: np.save(d, np.arange(64, dtype=np.float32)))
        x = torch.arange(300, dtype=torch.float32)
        q = self.put("g.bin", lambda d: _write(d, S.raw(x)))
        before = self.maps.refreshes
        t = torch.from_numpy(np.load(p, mmap_mode="r"))
        u = torch.from_file(q, shared=False, size=300, dtype=torch.float32)
        for _ in range(3):
            self.assertSame(t.to(torch.float64), _plain(lambda: t.to(torch.float64)))
            self.assertSame(u[7:].to(torch.float16), _plain(lambda: u[7:].to(torch.float16)))
        self.assertEqual(self.maps.refreshes, before)
        self.assertEqual(self.A.served(), {"torch.Tensor.to": 6})

    def test_a_mapping_nobody_hooked_is_found_by_a_rebuild(self):
        import mmap

        torch = self.torch
        x = torch.arange(1 << 18, dtype=torch.float32)  # 1 MiB: a miss this large rebuilds the index
        p = self.put("u.bin", lambda d: _write(d, S.raw(x)))
        with open(p, "rb") as f:
            m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
        self.maps.discover_at = 0.0  # the last rebuild was long ago
        before = self.maps.refreshes
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "The given buffer is not writable"
            t = torch.frombuffer(m, dtype=torch.float32)
        self.assertSame(t.to(torch.float16), _plain(lambda: t.to(torch.float16)))
        self.assertEqual(self.maps.refreshes, before + 1)
        self.assertEqual(self.A.served(), {"torch.Tensor.to": 1})
        del t

    def test_a_mapping_of_a_file_elsewhere_rebuilds_nothing(self):
        import numpy as np

        torch = self.torch
        p = os.path.join(_support.tmpdir(), "local.npy")
        np.save(p, np.arange(64, dtype=np.float32))
        self.maps.refresh()
        before = self.maps.refreshes
        for _ in range(3):
            torch.from_numpy(np.load(p, mmap_mode="r")).to(torch.float64)
        self.assertEqual(self.maps.refreshes, before)
        self.assertEqual((self.A.served(), self.A.fallbacks()), ({}, {}))

    def test_disable_puts_the_methods_back(self):
        torch = self.torch
        self.assertTrue(hasattr(torch.Tensor.to, "_gdsfs_original"))
        self.A.disable()
        try:
            for name in ("to", "cuda", "copy_"):
                self.assertFalse(hasattr(getattr(torch.Tensor, name), "_gdsfs_original"), name)
            self.assertEqual(self.moves.leases_kept(), 0)
        finally:
            self.A.enable()
        self.assertTrue(hasattr(torch.Tensor.to, "_gdsfs_original"))


if __name__ == "__main__":
    unittest.main()


class TestReplacedBehindTheMount(MovesCase):
    """Attributes and entries cached for an hour, no change events: a file
    renamed over directly in SOURCE is not seen by stat through the mount,
    while a lease, asked for by path, stages the file SOURCE names now."""

    sets = ("staging.watch=timestamps", "fuse.attr_timeout=1h", "fuse.entry_timeout=1h")

    def test_mapping_of_a_file_replaced_in_source_is_not_served_from_the_new_file(self):
        import numpy as np

        torch = self.torch
        old = np.arange(N, dtype=np.float32)
        p = self.put("swap.bin", lambda d: _write(d, old.tobytes()))
        t = torch.from_numpy(np.memmap(p, dtype=np.float32, mode="r", shape=(N,)))
        src = os.path.join(self.mount.src, "swap.bin")
        tmp = src + ".new"
        _write(tmp, (-old).tobytes())  # the same size, other bytes
        os.rename(tmp, src)
        want = _plain(lambda: t.to("cpu", copy=True))
        self.assertTrue(torch.equal(want, torch.from_numpy(old)), "the mapping shows the old file")
        self.assertSame(t.to("cpu", copy=True), want)
        self.assertEqual(self.A.served(), {})
        # Which check refuses it depends on whether the kernel still holds
        # the old entry when the lease is checked: then the daemon says the
        # path names another file (file-replaced); after a new look-up the
        # stat shows the new file (file-changed).
        self.assertIn(self.A.fallbacks(), ({"file-replaced": 1}, {"file-changed": 1}))

    def test_without_the_grants_identity_the_mount_tells_the_file_replaced(self):
        """A daemon whose grants do not say which file they hold (an older
        one): the check asks the mount (user.gdsfs.state) and still
        refuses the new file's bytes."""
        import gdsfs._lease

        real = gdsfs._lease._file_identity
        gdsfs._lease._file_identity = lambda v: None
        self.addCleanup(setattr, gdsfs._lease, "_file_identity", real)
        self.test_mapping_of_a_file_replaced_in_source_is_not_served_from_the_new_file()
