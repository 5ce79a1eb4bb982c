"""The Python client against a real daemon on the host backend
(staging.device=host): no GPU needed; root and /dev/fuse are."""

import errno
import gc
import hashlib
import json
import os
import signal
import sys
import unittest

import _support
from _support import NOBODY, child, have_torch, loud, start_mount

import gdsfs

CHUNK = 64 << 10


def blob(n, seed):
    # Distinct, cheap, deterministic bytes.
    out = bytearray()
    i = 0
    while len(out) < n:
        out += hashlib.sha256(b"%d:%d" % (seed, i)).digest()
        i += 1
    return bytes(out[:n])


class HostLeaseTests(unittest.TestCase):
    def setUp(self):
        self.m = start_mount(self, chunk_size="64KiB")

    def test_bytes_exact(self):
        sizes = [0, 1, 4095, 4096, CHUNK - 1, CHUNK, CHUNK + 1, 5 * CHUNK + 123]
        for i, n in enumerate(sizes):
            data = blob(n, i)
            p = self.m.write("f%d.bin" % n, data)
            with self.subTest(size=n):
                with gdsfs.open(p) as lease:
                    self.assertEqual(lease.size, n)
                    self.assertEqual(lease.device, "host")
                    self.assertFalse(lease.is_gpu)
                    self.assertIsNone(lease.ordinal)
                    self.assertGreaterEqual(sum(lease.chunks), n)
                    if n > CHUNK:
                        self.assertGreater(len(lease.chunks), 1, "want a multi-chunk mapping")
                    mv = lease.memoryview()
                    self.assertTrue(mv.readonly)
                    self.assertEqual(mv.format, "B")
                    self.assertEqual(len(mv), n)
                    self.assertEqual(bytes(mv), data)
                    self.assertEqual(lease.read(), data)
                    if n > 10:
                        self.assertEqual(lease.read(n // 2, 7), data[n // 2 : n // 2 + 7])
                        self.assertEqual(bytes(mv[n - 5 :]), data[n - 5 :])
                    if n:
                        with self.assertRaises(TypeError):
                            mv[0] = 1  # read-only
                    del mv
                self.assertTrue(lease.released)
        self.assertEqual(self.m.wait_leases(0), 0)

    def test_context_manager_releases(self):
        p = self.m.write("a.bin", blob(3 * CHUNK, 1))
        self.assertEqual(self.m.leases_active(), 0)
        with gdsfs.open(p) as lease:
            self.assertEqual(self.m.leases_active(), 1)
            self.assertFalse(lease.closed)
        self.assertTrue(lease.closed)
        self.assertTrue(lease.released)
        self.assertEqual(self.m.wait_leases(0), 0)
        lease.close()  # idempotent
        with self.assertRaises(ValueError):
            lease.memoryview()
        with self.assertRaises(ValueError):
            lease.ptr

    def test_views_defer_release(self):
        data = blob(2 * CHUNK + 7, 2)
        p = self.m.write("b.bin", data)
        lease = gdsfs.open(p)
        mv = lease.memoryview()
        part = mv[CHUNK : CHUNK + 100]
        del mv
        lease.close()
        self.assertTrue(lease.closed)
        self.assertFalse(lease.released, "a live view must keep the mapping")
        self.assertEqual(self.m.leases_active(), 1)
        self.assertEqual(bytes(part), data[CHUNK : CHUNK + 100])
        with self.assertRaises(ValueError):
            lease.memoryview()
        del part
        gc.collect()
        self.assertTrue(lease.released)
        self.assertEqual(self.m.wait_leases(0), 0)

    def test_del_releases(self):
        p = self.m.write("c.bin", blob(100, 3))
        lease = gdsfs.open(p)
        self.assertEqual(self.m.leases_active(), 1)
        del lease
        gc.collect()
        self.assertEqual(self.m.wait_leases(0), 0)

    def test_many_leases_one_file(self):
        data = blob(CHUNK + 1, 4)
        p = self.m.write("d.bin", data)
        leases = [gdsfs.open(p) for _ in range(5)]
        self.assertEqual(self.m.leases_active(), 5)
        self.assertEqual(len({l.id for l in leases}), 5)
        for l in leases:
            self.assertEqual(l.read(), data)
        self.assertEqual(len({l.ptr for l in leases}), 1, "one mapping shared by the leases of a file")
        self.assertTrue(all(l.reused for l in leases[1:]))
        for l in leases:
            l.close()
        self.assertEqual(self.m.wait_leases(0), 0)

    def test_stat(self):
        p = self.m.write("e.bin", blob(12345, 5))
        st = gdsfs.stat(p)
        self.assertEqual(st["size"], 12345)
        self.assertIn("state", st)
        with gdsfs.open(p):
            st = gdsfs.stat(p)
        self.assertEqual(st["state"], "resident")
        self.assertEqual(st["size"], 12345)
        with self.assertRaises(FileNotFoundError):
            gdsfs.stat(self.m.path("missing"))

    def test_missing_file(self):
        p = self.m.path("dir/missing.bin")
        with self.assertRaises(FileNotFoundError) as cm:
            gdsfs.open(p)
        self.assertEqual(cm.exception.errno, errno.ENOENT)
        self.assertEqual(cm.exception.filename, p)
        self.assertEqual(self.m.wait_leases(0), 0)

    def test_outside_mount(self):
        d = _support.tmpdir()
        p = os.path.join(d, "x.bin")
        with open(p, "wb") as f:
            f.write(b"x")
        with self.assertRaises(gdsfs.NotMountedError) as cm:
            gdsfs.open(p)
        self.assertIsInstance(cm.exception, OSError)
        self.assertIn("not under a gdsfs mount", str(cm.exception))
        with self.assertRaises(gdsfs.NotMountedError):
            gdsfs.stat(p)
        # SOURCE itself is not the mount either.
        with self.assertRaises(gdsfs.NotMountedError):
            gdsfs.open(os.path.join(self.m.src, "x"))

    def test_socket_override(self):
        data = blob(777, 6)
        p = self.m.write("sub/f.bin", data)
        with gdsfs.open(p, socket=self.m.sock) as lease:
            self.assertEqual(lease.read(), data)
        old = os.environ.get("GDSFS_SOCKET")
        os.environ["GDSFS_SOCKET"] = self.m.sock
        try:
            with gdsfs.open(p) as lease:
                self.assertEqual(lease.read(), data)
        finally:
            if old is None:
                del os.environ["GDSFS_SOCKET"]
            else:
                os.environ["GDSFS_SOCKET"] = old
        with self.assertRaises(FileNotFoundError):
            gdsfs.open(p, socket=os.path.join(self.m.dir, "no.sock"))

    def test_changed_file_new_generation(self):
        v1, v2 = blob(3 * CHUNK + 5, 7), blob(2 * CHUNK + 9, 8)
        p = self.m.write("g.bin", v1)
        old = gdsfs.open(p)
        self.addCleanup(old.close)
        self.assertEqual(old.read(), v1)
        old_mv = old.memoryview()
        self.m.write("g.bin", v2)
        st = os.stat(os.path.join(self.m.src, "g.bin"))
        os.utime(os.path.join(self.m.src, "g.bin"), ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
        with gdsfs.open(p) as new:
            self.assertEqual(new.size, len(v2))
            self.assertEqual(new.read(), v2)
            self.assertGreater(new.generation, old.generation)
        self.assertEqual(old.size, len(v1))
        self.assertEqual(bytes(old_mv), v1, "an old lease keeps the bytes it was given")
        self.assertEqual(old.read(), v1)

    def test_permission_denied_other_uid(self):
        secret = self.m.write("secret.bin", blob(100, 9), mode=0o600)
        public = self.m.write("public.bin", blob(100, 10), mode=0o644)
        script = r"""
import json, sys, gdsfs
out = []
for p in sys.argv[1:]:
    try:
        with gdsfs.open(p) as l:
            out.append({"path": p, "ok": True, "size": l.size})
    except OSError as e:
        out.append({"path": p, "ok": False, "cls": type(e).__name__, "errno": e.errno, "msg": str(e)})
print(json.dumps(out))
"""
        # The FUSE mount itself refuses other uids (fuse.allow_other=false),
        # so the child names the socket: the daemon's SO_PEERCRED check is
        # what is tested, with a readable file as the control.
        proc = child(script, [secret, public], uid=NOBODY, env={"GDSFS_SOCKET": self.m.sock})
        out, err = proc.communicate(timeout=60)
        self.assertEqual(proc.returncode, 0, err.decode(errors="replace"))
        res = json.loads(out)
        self.assertEqual(res[0]["cls"], "PermissionError", res)
        self.assertEqual(res[0]["errno"], errno.EACCES)
        self.assertIn("may not read", res[0]["msg"])
        self.assertEqual(res[1], {"path": public, "ok": True, "size": 100})
        self.assertGreaterEqual(self.m.stats()["lease_denied"], 1)
        self.assertEqual(self.m.wait_leases(0), 0)

    def test_kill9_releases(self):
        p = self.m.write("held.bin", blob(3 * CHUNK, 11))
        script = r"""
import sys, time, gdsfs
l = gdsfs.open(sys.argv[1])
mv = l.memoryview()
print("held", l.size, flush=True)
time.sleep(600)
"""
        proc = child(script, [p])

        def reap():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stdout.close()
            proc.stderr.close()

        self.addCleanup(reap)
        line = proc.stdout.readline()
        self.assertEqual(line.split()[:1], [b"held"], proc.stderr.read1(4096) if proc.poll() is not None else line)
        self.assertEqual(self.m.leases_active(), 1)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
        self.assertEqual(proc.returncode, -signal.SIGKILL)
        self.assertEqual(self.m.wait_leases(0, timeout=15), 0, "a killed holder's lease must end")

    def test_import_does_not_pull_torch_or_cupy(self):
        proc = child("import sys, gdsfs; print(sorted(m for m in ('torch', 'cupy', 'numpy') if m in sys.modules))")
        out, err = proc.communicate(timeout=60)
        self.assertEqual(proc.returncode, 0, err)
        self.assertEqual(out.strip(), b"[]")

    def test_gpu_api_on_host(self):
        p = self.m.write("h.bin", blob(64, 12))
        with gdsfs.open(p) as lease:
            with self.assertRaises(TypeError):
                lease.cupy()
            self.assertNotEqual(lease.ptr, 0)  # host mapping address


class HostTorchTests(unittest.TestCase):
    """torch on the host backend (torch.frombuffer over the mapping)."""

    def setUp(self):
        if not have_torch():
            self.skipTest(loud("SKIPPED: torch is not importable by %s; host tensor tests not run" % sys.executable))
        self.m = start_mount(self, chunk_size="64KiB")

    def test_tensor(self):
        import torch

        data = blob(3 * CHUNK + 8, 13)
        p = self.m.write("t.bin", data)
        with gdsfs.open(p) as lease:
            t = lease.tensor()
            self.assertEqual(t.dtype, torch.uint8)
            self.assertEqual(tuple(t.shape), (len(data),))
            self.assertEqual(bytes(t.tolist()), data)
            f = lease.tensor(torch.float32, (4, 8), offset=CHUNK)
            ref = torch.frombuffer(bytearray(data[CHUNK : CHUNK + 128]), dtype=torch.float32).view(4, 8)
            self.assertTrue(torch.equal(f.view(torch.int32), ref.view(torch.int32)))
            b = lease.tensor("bfloat16", offset=2)
            self.assertEqual(tuple(b.shape), ((len(data) - 2) // 2,))
            for bad in (dict(dtype=torch.float32, offset=2), dict(dtype=torch.float32, shape=(len(data),)),
                        dict(shape=(-1,)), dict(offset=len(data) + 1)):
                with self.assertRaises(ValueError, msg=str(bad)):
                    lease.tensor(**bad)
            with self.assertRaises(TypeError):
                lease.tensor("notadtype")
        # Tensors outlive the with-block and keep the lease.
        self.assertEqual(self.m.leases_active(), 1)
        self.assertEqual(bytes(t[:16].tolist()), data[:16])
        del t, f, b, ref
        gc.collect()
        self.assertEqual(self.m.wait_leases(0), 0)

    def test_load_lifetime(self):
        import weakref

        import torch

        data = blob(2 * CHUNK + 3, 14)
        p = self.m.write("l.bin", data)
        t = gdsfs.load(p)
        self.assertEqual(bytes(t.tolist()), data)
        self.assertEqual(self.m.leases_active(), 1)
        v = t[5:9]
        ref = weakref.ref(t)
        del t
        gc.collect()
        self.assertIsNone(ref())
        self.assertEqual(self.m.leases_active(), 1, "a view of the tensor still holds the lease")
        self.assertEqual(bytes(v.tolist()), data[5:9])
        del v
        gc.collect()
        self.assertEqual(self.m.wait_leases(0), 0)
        e = gdsfs.load(self.m.write("empty.bin", b""), torch.float32)
        self.assertEqual(tuple(e.shape), (0,))
        self.assertEqual(self.m.wait_leases(0), 0)
        i = gdsfs.load(p, torch.int16, (2, 3), offset=4)
        self.assertEqual(tuple(i.shape), (2, 3))

    def test_leased_ahead(self):
        """gdsfs.torch.leased: tensors of the files in order, leased ahead
        in batches; stopping early ends the leases not yet yielded."""
        import torch

        import gdsfs.torch as gt

        datas = [blob(4096 * (i + 1), 80 + i) for i in range(10)]
        paths = [self.m.write("s%02d.bin" % i, d) for i, d in enumerate(datas)]
        got = [bytes(t.tolist()) for t in gt.leased(paths, ahead=3)]
        self.assertEqual(got, datas)
        it = gt.leased(paths, torch.int32, ahead=4, batch=2)
        first = next(it)
        self.assertEqual(first.dtype, torch.int32)
        it.close()
        del first
        gc.collect()
        self.assertEqual(self.m.wait_leases(0), 0, "leases made ahead end when the iteration stops")
        with self.assertRaises(FileNotFoundError):
            list(gt.leased(paths[:2] + [self.m.path("none.bin")], ahead=2))
        gdsfs.disconnect()

    def test_dataloader_over_shards(self):
        import torch

        import gdsfs.torch as gt

        datas = [blob(8192, 90 + i) for i in range(8)]
        paths = [self.m.write("d%02d.bin" % i, d) for i, d in enumerate(datas)]
        ds = gt.LeasedFiles(paths, shuffle=True, seed=3, ahead=4)
        loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=0)
        for epoch in range(2):
            ds.set_epoch(epoch)
            seen = sorted(bytes(t.tolist()) for t in loader)
            self.assertEqual(seen, sorted(datas))
        gc.collect()
        self.assertEqual(self.m.wait_leases(0), 0)
        gdsfs.disconnect()


if __name__ == "__main__":
    unittest.main()
