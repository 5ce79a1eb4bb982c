"""GPU tests of the Python client: a real daemon staging onto CUDA
(staging.device=cuda), leases imported with the CUDA driver API, used from
torch and cupy.

They skip, loudly, unless a CUDA device answers (and root, /dev/fuse and a
gdsfs binary are there). With GDSFS_REQUIRE_GPU=1 every such skip is a
failure instead, and so is a missing torch or cupy.

Standalone, on a machine without Go:
    GDSFS_BIN=/path/to/gdsfs GDSFS_REQUIRE_GPU=1 python3 python/tests/test_gpu.py -v
"""

import ctypes
import gc
import hashlib
import os
import signal
import unittest
import weakref

import _support
from _support import child, loud

import gdsfs

MiB = 1 << 20
REQUIRE = os.environ.get("GDSFS_REQUIRE_GPU") == "1"

_gpu = None


def gpu_reason():
    """None when a CUDA device answers, else why not."""
    global _gpu
    if _gpu is None:
        try:
            lib = ctypes.CDLL("libcuda.so.1")
            r = lib.cuInit(0)
            n = ctypes.c_int()
            if r != 0:
                _gpu = "cuInit failed (CUresult %d)" % r
            elif lib.cuDeviceGetCount(ctypes.byref(n)) != 0 or n.value < 1:
                _gpu = "no CUDA device"
            else:
                _gpu = ""
        except OSError as e:
            _gpu = "libcuda.so.1 not loadable (%s)" % e
    return _gpu or None


def need(tc, what, why):
    msg = "SKIPPED GPU TEST (%s): %s" % (what, why)
    if REQUIRE:
        tc.fail("GDSFS_REQUIRE_GPU=1 but " + msg)
    tc.skipTest(loud(msg))


def data_of(n, seed):
    out = bytearray()
    i = 0
    while len(out) < n:
        out += hashlib.sha512(b"%d/%d" % (seed, i)).digest()
        i += 1
    return bytes(out[:n])


def sha(b):
    return hashlib.sha256(b).hexdigest()


def torch_bytes(t):
    """The bytes of a tensor, copied to the host (no numpy needed)."""
    import torch

    u = t.detach().contiguous().view(-1).view(torch.uint8).cpu()
    try:
        return u.numpy().tobytes()
    except (ImportError, RuntimeError):  # torch without numpy
        return bytes(u.tolist())


class GPUBase(unittest.TestCase):
    sharing = "shared"
    chunk = "2MiB"

    def setUp(self):
        why = gpu_reason()
        if why:
            need(self, "no GPU", why)
        why = _support.mount_skip_reason()
        if why:
            need(self, "no mount", why)
        sets = ["ipc.sharing=" + self.sharing, "staging.capacity=4GiB"]
        self.m = _support.Mount(device="cuda", sets=sets, chunk_size=self.chunk)
        self.addCleanup(self.m.stop)

    def torch(self):
        try:
            import torch
        except ImportError as e:
            need(self, "no torch", str(e))
        if not torch.cuda.is_available():
            need(self, "torch without CUDA", "torch.cuda.is_available() is False")
        return torch

    def cupy(self):
        try:
            import cupy
        except ImportError as e:
            need(self, "no cupy", str(e))
        return cupy


class GPULeaseTests(GPUBase):
    def test_driver_only_bytes(self):
        """No torch: map on the GPU and copy back with cuMemcpyDtoH."""
        for n in (1, MiB + 12345, 64 * MiB + 7):
            data = data_of(n, n)
            p = self.m.write("d%d.bin" % n, data)
            with self.subTest(size=n), gdsfs.open(p) as lease:
                self.assertTrue(lease.device.startswith("GPU-"), lease.device)
                self.assertTrue(lease.is_gpu)
                self.assertIsInstance(lease.ordinal, int)
                self.assertNotEqual(lease.ptr, 0)
                if n > 2 * MiB:
                    self.assertGreater(len(lease.chunks), 1)
                self.assertEqual(sha(lease.read()), sha(data))
                self.assertEqual(lease.read(n // 3, 1000), data[n // 3 : n // 3 + 1000])
                with self.assertRaises(TypeError):
                    lease.memoryview()
        self.assertEqual(self.m.wait_leases(0), 0)

    def test_torch_sha256(self):
        torch = self.torch()
        for n in (MiB + 12345, 64 * MiB):
            data = data_of(n, 7 + n)
            p = self.m.write("t%d.bin" % n, data)
            with self.subTest(size=n), gdsfs.open(p) as lease:
                t = lease.tensor()
                self.assertEqual(t.device, torch.device("cuda", lease.ordinal))
                self.assertEqual(t.dtype, torch.uint8)
                self.assertEqual(tuple(t.shape), (n,))
                self.assertEqual(t.data_ptr(), lease.ptr, "zero-copy: the tensor is the mapping")
                self.assertEqual(sha(torch_bytes(t)), sha(data))
                del t
        self.assertEqual(self.m.wait_leases(0), 0)

    def test_torch_dtypes_shapes(self):
        torch = self.torch()
        data = data_of(4 * MiB + 64, 3)
        p = self.m.write("f.bin", data)
        host = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        with gdsfs.open(p) as lease:
            f = lease.tensor(torch.float32, (256, 1024), offset=MiB)
            ref = host[MiB : MiB + 256 * 1024 * 4].view(torch.float32).view(256, 1024)
            self.assertTrue(torch.equal(f.cpu().view(torch.int32), ref.view(torch.int32)))
            self.assertEqual(f.data_ptr(), lease.ptr + MiB)
            b = lease.tensor("bfloat16", (4, 8), offset=2)
            self.assertTrue(torch.equal(b.cpu().view(torch.int16), host[2:66].view(torch.int16).view(4, 8)))
            s = f.view(torch.int32).sum()  # a kernel reads the mapping
            self.assertEqual(s.item(), ref.view(torch.int32).sum().item())
            with self.assertRaises(ValueError):
                lease.tensor(torch.float32, offset=2)
            with self.assertRaises(ValueError):
                lease.tensor(torch.float32, (MiB + 100,))
        # f outlives the with-block; the lease waits for it.
        self.assertEqual(self.m.leases_active(), 1)
        torch.cuda.synchronize()
        self.assertTrue(torch.equal(f[0].cpu().view(torch.int32), ref[0].view(torch.int32)))
        del f, b, s
        gc.collect()
        self.assertEqual(self.m.wait_leases(0), 0)

    def test_load_lifetime(self):
        torch = self.torch()
        data = data_of(3 * MiB + 5, 4)
        p = self.m.write("l.bin", data)
        t = gdsfs.load(p)
        self.assertEqual(t.device.type, "cuda")
        self.assertEqual(self.m.leases_active(), 1)
        view = t[100:200]
        r = weakref.ref(t)
        del t
        gc.collect()
        self.assertIsNone(r())
        self.assertEqual(self.m.leases_active(), 1)
        self.assertEqual(torch_bytes(view), data[100:200])
        del view
        gc.collect()
        self.assertEqual(self.m.wait_leases(0), 0)
        h = gdsfs.load(p, torch.float16, (16, 16), offset=512)
        self.assertEqual(h.dtype, torch.float16)
        del h
        gc.collect()
        self.assertEqual(self.m.wait_leases(0), 0)

    def test_cupy(self):
        cupy = self.cupy()
        data = data_of(MiB + 333, 5)
        p = self.m.write("c.bin", data)
        with gdsfs.open(p) as lease:
            a = lease.cupy()
            self.assertEqual(a.shape, (len(data),))
            self.assertEqual(a.data.ptr, lease.ptr)
            self.assertEqual(sha(cupy.asnumpy(a).tobytes()), sha(data))
            w = lease.cupy("float32", (16, 4), offset=4096)
            self.assertEqual(cupy.asnumpy(w).tobytes(), data[4096 : 4096 + 256])
        self.assertEqual(self.m.leases_active(), 1)  # a and w hold it
        del a, w
        gc.collect()
        self.assertEqual(self.m.wait_leases(0), 0)

    def test_torch_and_cupy_agree(self):
        torch = self.torch()
        cupy = self.cupy()
        data = data_of(2 * MiB + 1, 6)
        p = self.m.write("tc.bin", data)
        with gdsfs.open(p) as lease:
            t = lease.tensor()
            a = lease.cupy()
            self.assertEqual(t.data_ptr(), a.data.ptr)
            self.assertTrue(torch.equal(t, torch.as_tensor(a, device=t.device)))

    def test_kill9_releases(self):
        p = self.m.write("k.bin", data_of(5 * MiB, 8))
        proc = child("import sys, time, gdsfs\nl = gdsfs.open(sys.argv[1])\nprint('held', l.ptr, flush=True)\ntime.sleep(600)\n", [p])
        try:
            line = proc.stdout.readline()
            if not line.startswith(b"held"):
                proc.wait(30)
                self.fail("child failed: %s" % proc.stderr.read().decode(errors="replace"))
            self.assertEqual(self.m.leases_active(), 1)
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stdout.close()
            proc.stderr.close()
        self.assertEqual(self.m.wait_leases(0, 15), 0)

    def test_driver_first_then_torch(self):
        """A fresh process: gdsfs initialises CUDA before torch does, and the
        other way round; both share the primary context."""
        self.torch()
        p = self.m.write("o.bin", data_of(MiB + 1, 9))
        want = sha(data_of(MiB + 1, 9))
        for first in ("gdsfs", "torch"):
            script = (
                "import sys, hashlib, gdsfs, torch\n"
                "if sys.argv[2] == 'torch': torch.zeros(1, device='cuda')\n"
                "l = gdsfs.open(sys.argv[1])\n"
                "t = l.tensor()\n"
                "print(hashlib.sha256(bytes(t.cpu().tolist())).hexdigest(), t.device, torch.cuda.current_device())\n"
            )
            with self.subTest(first=first):
                proc = child(script, [p, first])
                out, err = proc.communicate(timeout=300)
                self.assertEqual(proc.returncode, 0, err.decode(errors="replace"))
                self.assertEqual(out.split()[0].decode(), want, out)


class GPUSharedTests(GPUBase):
    sharing = "shared"

    def test_zero_copy_shared_read_only(self):
        """Shared leases are one read-only mapping: a consumer writing into
        one faults in that process only, and the next lease of the file
        still has the file's bytes."""
        torch = self.torch()
        data = data_of(MiB + 99, 10)
        p = self.m.write("s.bin", data)
        with gdsfs.open(p) as l1, gdsfs.open(p) as l2:
            self.assertEqual(l1.sharing, "shared")
            self.assertTrue(l1.readonly, "the driver refused read-only access (CU_MEM_ACCESS_FLAGS_PROT_READ)")
            self.assertEqual(l1.ptr, l2.ptr, "one mapping per file in a process")
            self.assertTrue(l2.reused)
        script = (
            "import sys, torch, gdsfs\n"
            "l = gdsfs.open(sys.argv[1])\n"
            "t = l.tensor()\n"
            "print('readonly', l.readonly, flush=True)\n"
            "try:\n"
            "    t[:16] = 7\n"
            "    torch.cuda.synchronize()\n"
            "    print('written', flush=True)\n"
            "except Exception as e:\n"
            "    print('faulted', type(e).__name__, str(e).splitlines()[0], flush=True)\n"
        )
        proc = child(script, [p])
        out, err = proc.communicate(timeout=300)
        self.assertIn(b"readonly True", out, err)
        self.assertNotIn(b"written", out, "a write through a shared lease went through")
        self.assertTrue(b"faulted" in out or proc.returncode != 0, (out, err))
        with gdsfs.open(p) as l3:
            self.assertEqual(sha(l3.read()), sha(data), "the next lease has the file's bytes")
            t = l3.tensor()
            self.assertEqual(sha(torch_bytes(t)), sha(data))
            del t
        gdsfs.disconnect()
        self.assertEqual(self.m.wait_leases(0), 0)

    def test_repeat_lease_fast_path(self):
        data = data_of(32 * MiB, 12)
        p = self.m.write("r.bin", data)
        with gdsfs.open(p) as first:
            ptr = first.ptr
        for _ in range(50):
            with gdsfs.open(p) as again:
                self.assertTrue(again.reused)
                self.assertEqual(again.ptr, ptr)
        with gdsfs.open(p) as l:
            self.assertEqual(sha(l.read()), sha(data))
        paths = [self.m.write("b%d.bin" % i, data_of(MiB, 20 + i)) for i in range(8)]
        leases = gdsfs.open_many(paths)
        for i, l in enumerate(leases):
            self.assertEqual(sha(l.read()), sha(data_of(MiB, 20 + i)))
            l.close()
        again = gdsfs.open_many(paths)
        self.assertTrue(all(l.reused for l in again))
        for l in again:
            l.close()
        gdsfs.disconnect()


class GPUPrivateTests(GPUBase):
    sharing = "private"

    def test_private_copies(self):
        torch = self.torch()
        data = data_of(MiB + 99, 11)
        p = self.m.write("p.bin", data)
        with gdsfs.open(p) as l1, gdsfs.open(p) as l2:
            self.assertEqual(l1.sharing, "private")
            t1, t2 = l1.tensor(), l2.tensor()
            self.assertEqual(torch_bytes(t1), data)
            t1[:16] = 7
            torch.cuda.synchronize()
            self.assertEqual(torch_bytes(t2[:16]), data[:16], "private mode: each lease its own copy")
            del t1, t2
        with gdsfs.open(p) as l3:
            self.assertEqual(sha(l3.read()), sha(data))
            self.assertFalse(l3.readonly)
        self.assertEqual(self.m.wait_leases(0), 0)


if __name__ == "__main__":
    unittest.main()
