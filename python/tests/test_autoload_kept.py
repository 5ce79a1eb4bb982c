"""What a served move costs beyond the copy: the daemon round trips per
file and the system calls per tensor, counted on real host-backend mounts
(moves into CPU memory stand in for moves to a GPU, as in
test_autoload_moves), and the leases the autoloader keeps across moves:
bounded, given up for room, ended at exit and not shared with a forked
child. Needs torch: fails in CI without it."""

import contextlib
import gc
import os
import subprocess
import sys
import unittest

import _support
from _support import Mount, start_mount
import _autoload_support as S
from gdsfs import _proto
from test_autoload_moves import MovesCase, _plain, _write


class Counts:
    """Calls made inside the with-block: daemon requests and releases,
    connections opened, and the system calls of deciding provenance."""

    def __init__(self):
        self.n = dict(request=0, release=0, connect=0, readlink=0, stat=0, getpid=0, pagemap=0)

    @contextlib.contextmanager
    def counting(self):
        from gdsfs import _proto
        from gdsfs.autoload import _maps

        saved = [(_proto.Conn, "request"), (_proto.Conn, "release"), (_proto.Conn, "__init__"),
                 (os, "readlink"), (os, "stat"), (os, "getpid"), (_maps, "written_pages")]
        old = [getattr(o, a) for o, a in saved]
        n = self.n

        def wrap(name, fn):
            def w(*a, **k):
                n[name] += 1
                return fn(*a, **k)
            return w

        for (o, a), fn, name in zip(saved, old, ("request", "release", "connect", "readlink", "stat", "getpid", "pagemap")):
            setattr(o, a, wrap(name, fn))
        try:
            yield n
        finally:
            for (o, a), fn in zip(saved, old):
                setattr(o, a, fn)


class TestFixedCosts(MovesCase):
    def setUp(self):
        super().setUp()
        self.moves.release()  # another test's
    def test_repeated_moves_from_one_mapping(self):
        """N moves out of one mapped file: no daemon round trip and no new
        connection after the first, no /proc/self/map_files lookup while the
        mapping's owner lives, no getpid (forks are seen by a fork handler),
        one identity stat per move, and the pagemap read only for the
        private mapping."""
        import numpy as np

        torch = self.torch
        a = np.arange(64 * 64, dtype=np.float32).reshape(64, 64)
        p = self.put("one.npy", lambda d: np.save(d, a))
        t = torch.from_numpy(np.load(p, mmap_mode="r"))
        x = torch.randn(64, 64, generator=torch.Generator().manual_seed(5))
        q = self.put("one.bin", lambda d: _write(d, S.raw(x)))
        st = torch.ByteStorage.from_file(q, False, x.numel() * 4) if not hasattr(torch.UntypedStorage, "from_file") \
            else torch.UntypedStorage.from_file(q, False, x.numel() * 4)
        u = torch.empty(0, dtype=torch.uint8).set_(st.untyped() if hasattr(st, "untyped") else st)
        u = u.view(torch.float32).view(64, 64)
        for src in (t, u):
            src[:1].to(torch.float64)  # the first move takes the lease
        N = 20
        for src, private in ((t, False), (u, True)):
            with self.subTest(private=private):
                c = Counts()
                with c.counting() as n:
                    for i in range(N):
                        got = src[i].to(torch.float64)
                        self.assertSame(got, _plain(lambda: src[i].to(torch.float64)), "row %d" % i)
                self.assertEqual((n["request"], n["release"], n["connect"]), (0, 0, 0), n)
                self.assertEqual((n["readlink"], n["getpid"]), (0, 0), n)
                self.assertEqual(n["stat"], N, n)
                self.assertEqual(n["pagemap"], N if private else 0, n)
        self.assertEqual(self.A.served(), {"torch.Tensor.to": 2 * N + 2}, self.A.fallbacks())
        del st

    def test_one_move_each_from_n_files_twice(self):
        """An epoch over N shards (np.load mmap, move, drop): one acquire
        per file the first time, none the second; a shard changed between
        the epochs is leased anew and served as it is now."""
        import numpy as np

        torch = self.torch
        m = start_mount(self, device="host", sets=("fuse.attr_timeout=0s", "fuse.entry_timeout=0s"))
        N = 6
        names = ["s%d.npy" % i for i in range(N)]
        for i, name in enumerate(names):
            np.save(os.path.join(m.src, name), np.full(1024, i, dtype=np.float32))

        def epoch():
            for i, name in enumerate(names):
                arr = np.load(m.path(name), mmap_mode="r")
                got = torch.from_numpy(arr).to(torch.float64)
                self.assertTrue(torch.equal(got, torch.from_numpy(np.array(arr)).double()), name)
                del arr
                gc.collect()

        c = Counts()
        with c.counting() as n:
            epoch()
        # one acquire per file, all on one connection, and one hello
        self.assertEqual((n["request"], n["connect"]), (N + 1, 2), n)
        c = Counts()
        with c.counting() as n:
            epoch()
        self.assertEqual((n["request"], n["release"], n["connect"]), (0, 0, 0), n)
        self.assertEqual(m.wait_leases(N), N)
        np.save(os.path.join(m.src, names[2]), np.full(2048, 7, dtype=np.float32))
        c = Counts()
        with c.counting() as n:
            epoch()
        # the old version's mapping kept by gdsfs.open is asked first
        # (ESTALE), then the new one is leased on the same connection
        self.assertEqual((n["request"], n["connect"]), (2, 0), n)
        self.assertEqual(self.A.served(), {"torch.Tensor.to": 3 * N}, self.A.fallbacks())
        self.assertEqual(self.moves.leases_kept(), N, "the changed shard's old lease is still kept")
        self.assertEqual(m.wait_leases(N), N)

    def test_kept_leases_are_bounded(self):
        """Past MAX_LEASES the least recently used kept lease ends."""
        import numpy as np

        torch = self.torch
        m = start_mount(self, device="host")
        self.addCleanup(setattr, self.moves, "MAX_LEASES", self.moves.MAX_LEASES)
        self.moves.MAX_LEASES = 3
        for i in range(5):
            np.save(os.path.join(m.src, "b%d.npy" % i), np.arange(256, dtype=np.float32) + i)
            t = torch.from_numpy(np.load(m.path("b%d.npy" % i), mmap_mode="r"))
            self.assertSame(t.to(torch.float64), _plain(lambda: t.to(torch.float64)))
            del t
            gc.collect()
        self.assertEqual(self.A.served(), {"torch.Tensor.to": 5})
        self.assertEqual(self.moves.leases_kept(), 3)
        self.assertEqual(m.wait_leases(3), 3)
        self.moves.release()
        self.assertEqual(m.wait_leases(0), 0)

    def test_kept_leases_give_way_to_a_move_short_of_room(self):
        """The uid's held-bytes bound full of this process's kept leases: a
        move of another file closes them and is served."""
        import numpy as np

        torch = self.torch
        m = start_mount(self, device="host", sets=("ipc.max_held_per_uid=160KiB",))
        ts = []
        for i in range(3):
            np.save(os.path.join(m.src, "r%d.npy" % i), np.arange(16384, dtype=np.float32) + i)  # 64 KiB
            ts.append(torch.from_numpy(np.load(m.path("r%d.npy" % i), mmap_mode="r")))
        for t in ts:
            self.assertSame(t.to(torch.float64), _plain(lambda: t.to(torch.float64)))
        self.assertEqual(self.A.served(), {"torch.Tensor.to": 3}, self.A.fallbacks())
        self.assertEqual(self.A.fallbacks(), {})
        self.assertEqual(self.moves.leases_kept(), 1)

    def test_kept_leases_give_way_to_a_move_refused_for_connections(self):
        """The uid at ipc.max_connections_per_uid with this process's kept
        leases on one connection, busy with another request (as another
        thread's would be): the move of another file, refused for a new
        connection, closes the kept leases, and once that request is done
        the connection, holding nothing, closes and the next move is
        served, instead of every file not kept yet being refused while the
        process lives."""
        import numpy as np
        from gdsfs import _registry

        torch = self.torch
        m = start_mount(self, device="host", sets=("ipc.max_connections=8", "ipc.max_connections_per_uid=4"))
        ts = []
        for i in range(4):
            np.save(os.path.join(m.src, "c%d.npy" % i), np.arange(256, dtype=np.float32) + i)
            ts.append(torch.from_numpy(np.load(m.path("c%d.npy" % i), mmap_mode="r")))
        from gdsfs.autoload import _serve

        _serve._remember(m.mnt, False)  # a host mount: no hello connection to count
        for t in ts[:2]:
            self.assertSame(t.to(torch.float64), _plain(lambda: t.to(torch.float64)))
        pool = [h for k, hs in _registry.registry.pools.items() if k[0] == m.sock for h in hs]
        self.assertEqual(len(pool), 1, "the kept leases are not on one connection")
        with _registry.registry.lock:
            pool[0].busy += 1  # in use by another request
        # the uid's other three connections: it is at its limit
        watch = []
        for _ in range(3):
            c = _proto.Conn(m.sock)
            self.addCleanup(c.close)
            c.request({"op": "hello", "version": 1})  # answered: admitted, counted
            watch.append(c)
        self.assertSame(ts[2].to(torch.float64), _plain(lambda: ts[2].to(torch.float64)))
        self.assertEqual(self.A.fallbacks(), {"refused:EMFILE": 1})
        self.assertEqual(self.moves.leases_kept(), 0)
        # The fallback is reported to the daemon by a background thread, on
        # a connection of its own: sent after the checkin below, it could
        # take the connection the kept leases gave up, and the next move be
        # refused too. Wait until it is answered (refused, the uid at its
        # limit) while the busy connection still holds the uid's fourth.
        from gdsfs.autoload import _report

        self.assertTrue(_report.flush(60), "the fallback's report is not answered")
        _registry.registry.checkin(pool[0])  # its request is done: it holds nothing, so it closes
        # the daemon ends the closed connection as it reads its end: the
        # uid's three others open (two besides the asking one)
        resp, _ = watch[0].request({"op": "wait_stat", "key": "ipc_open_connections", "value": 2, "timeout_ms": 15000})
        self.assertTrue(resp.get("ok"), resp)
        self.assertSame(ts[3].to(torch.float64), _plain(lambda: ts[3].to(torch.float64)))
        self.assertEqual(self.A.served(), {"torch.Tensor.to": 3}, self.A.fallbacks())
        self.assertEqual(self.moves.leases_kept(), 1)


class TestKeptUnderPressure(MovesCase):
    sets = ("ipc.cache_headroom=100%",)  # every grant says the daemon is short of room

    def test_a_daemon_short_of_room_keeps_one(self):
        """A grant saying the daemon is short of room ("cache": false) ends
        the other kept leases: one file is kept at a time."""
        import numpy as np

        torch = self.torch
        self.moves.release()
        ts = []
        for i in range(3):
            p = self.put("p%d.npy" % i, lambda d, i=i: np.save(d, np.arange(256, dtype=np.float32) + i))
            ts.append(torch.from_numpy(np.load(p, mmap_mode="r")))
        for t in ts:
            self.assertSame(t.to(torch.float64), _plain(lambda: t.to(torch.float64)))
        self.assertEqual(self.A.served(), {"torch.Tensor.to": 3}, self.A.fallbacks())
        self.assertEqual(self.moves.leases_kept(), 1)
        self.assertEqual(self.mount.wait_leases(1), 1)
        self.moves.release()


class TestKeptAtExit(unittest.TestCase):
    def test_kept_leases_end_before_the_interpreter_does(self):
        """At exit the kept leases are closed by the autoloader itself
        (before CUDA and the interpreter tear down), not left to the
        process's end."""
        S.require_torch(self)
        m = start_mount(self, device="host")
        import numpy as np

        np.save(os.path.join(m.src, "x.npy"), np.arange(64, dtype=np.float32))
        script = (
            "import atexit\n"
            "out = {}\n"
            "atexit.register(lambda: print('kept at exit', out['moves'].leases_kept(), flush=True))\n"
            "import numpy as np, torch, gdsfs.autoload as A\n"
            "from gdsfs.autoload import _moves\n"
            "out['moves'] = _moves\n"
            "_moves.TARGETS = ('cuda', 'cpu')\n"
            "t = torch.from_numpy(np.load(%r, mmap_mode='r'))\n"
            "t.to(torch.float64)\n"
            "print('kept', _moves.leases_kept(), A.served(), flush=True)\n" % m.path("x.npy"))
        p = _support.child(script)
        out, err = p.communicate(timeout=120)
        self.assertEqual(p.returncode, 0, err)
        self.assertEqual(out.decode().split("\n")[-3:], ["kept 1 {'torch.Tensor.to': 1}", "kept at exit 0", ""],
                         out.decode())


class TestLeasesAhead(MovesCase):
    """Files of a directory mapped in the order of their names: the next
    ones, resident and with the same extension, are leased by the
    autoloader's worker before any move asks (_ahead.idle() waits for the
    worker; nothing here depends on how fast it is)."""

    def setUp(self):
        from gdsfs.autoload import _ahead

        super().setUp()
        self.ahead = _ahead
        self.moves.release()
        _ahead.AHEAD = 3
        self.addCleanup(setattr, _ahead, "AHEAD", 0)
        self.addCleanup(self.moves.release)

    def shards(self, n, resident, links=None):
        """A mount with s0.npy ... s{n-1}.npy and s3.txt; the shards
        numbered in resident staged (and no lease left on them). links:
        {i: target}: s{i}.npy is a symbolic link to target instead."""
        import numpy as np

        m = start_mount(self, device="host")
        for i in range(n):
            p = os.path.join(m.src, "s%d.npy" % i)
            if links and i in links:
                os.symlink(links[i], p)
            else:
                np.save(p, np.full(1024, i, dtype=np.float32))
        _write(os.path.join(m.src, "s3.txt"), b"not a shard")
        subprocess.run([_support.gdsfs_bin()[0], "warmup", "--wait"] + [m.path("s%d.npy" % i) for i in resident] +
                       [m.path("s3.txt")], check=True, stdout=subprocess.DEVNULL)
        self.assertEqual(m.wait_leases(0), 0)
        return m

    def idle(self):
        """Wait for the worker's queued work (a worker stuck fails the test)."""
        self.assertTrue(self.ahead.idle(120), "the lease-ahead worker did not finish its queued work")

    def mapped(self, m, i):
        import numpy as np

        return self.torch.from_numpy(np.load(m.path("s%d.npy" % i), mmap_mode="r"))

    def kept(self):
        return {os.path.basename(k.lease.path): k.lease.id for k in self.moves._leases.values()}

    def state(self, m, name):
        return os.getxattr(m.path(name), "user.gdsfs.state")

    def test_files_mapped_in_order_lease_the_next_resident_ones(self):
        torch = self.torch
        m = self.shards(8, [0, 1, 2, 3, 5, 6, 7])
        t0 = self.mapped(m, 0)
        self.assertSame(t0.to(torch.float64), _plain(lambda: t0.to(torch.float64)))
        t1 = self.mapped(m, 1)  # after s0: s0 and s1, then s2, s3 and s4 (s3.txt is not a shard)
        self.idle()
        self.assertEqual(set(self.kept()), {"s0.npy", "s1.npy", "s2.npy", "s3.npy"})
        self.assertEqual(self.state(m, "s4.npy"), b"absent", "a file not resident was staged ahead")
        ids = self.kept()
        self.assertSame(t1.to(torch.float64), _plain(lambda: t1.to(torch.float64)))
        t2 = self.mapped(m, 2)  # after s1: s3, s4, s5
        self.assertSame(t2.to(torch.float64), _plain(lambda: t2.to(torch.float64)))
        self.idle()
        got = self.kept()
        self.assertEqual((got["s1.npy"], got["s2.npy"]), (ids["s1.npy"], ids["s2.npy"]), "a move took another lease")
        self.assertEqual(set(got), {"s0.npy", "s1.npy", "s2.npy", "s3.npy", "s5.npy"})
        self.assertEqual(self.A.served(), {"torch.Tensor.to": 3})
        self.assertEqual(self.A.fallbacks(), {})
        self.assertEqual(m.wait_leases(5), 5)

    def test_leases_ahead_ask_the_daemon_not_the_mount(self):
        """A daemon that knows resident and identity is asked for resident
        files only, and says which file it leased: the worker asks the
        mount nothing (user.gdsfs.state) and stages nothing."""
        m = self.shards(6, [0, 1, 2, 4, 5])
        asked, real = [], os.getxattr

        def getxattr(path, name, *a, **k):
            if name == "user.gdsfs.state":
                asked.append(os.path.basename(path))
            return real(path, name, *a, **k)

        os.getxattr = getxattr
        self.addCleanup(setattr, os, "getxattr", real)
        ts = [self.mapped(m, 0), self.mapped(m, 1)]  # after s0: s0, s1 and s2, s3, s4
        self.idle()
        self.assertEqual(asked, [], "the worker asked the mount")
        self.assertEqual(set(self.kept()), {"s0.npy", "s1.npy", "s2.npy", "s4.npy"})
        self.assertEqual(self.state(m, "s3.npy"), b"absent", "a file not resident was staged ahead")
        self.assertEqual(self.A.fallbacks(), {})
        del ts

    def test_leases_ahead_from_a_daemon_without_resident(self):
        """A daemon that does not know resident: the mount's
        user.gdsfs.state says which files are resident, and nothing else
        is staged ahead."""
        from gdsfs.autoload import _serve

        m = self.shards(6, [0, 1, 2, 4, 5])
        _serve._older.add(_serve._socket_of(m.path("s0.npy")))
        self.addCleanup(_serve._older.clear)
        ts = [self.mapped(m, 0), self.mapped(m, 1)]
        self.idle()
        self.assertEqual(set(self.kept()), {"s0.npy", "s1.npy", "s2.npy", "s4.npy"})
        self.assertEqual(self.state(m, "s3.npy"), b"absent", "a file not resident was staged ahead")
        self.assertEqual(self.A.fallbacks(), {})
        del ts

    def test_files_mapped_out_of_order_lease_nothing_ahead(self):
        m = self.shards(8, range(8))
        ts = [self.mapped(m, i) for i in (5, 2, 7, 0, 0, 6)]
        self.idle()
        self.assertEqual(self.kept(), {})
        self.assertEqual(m.wait_leases(0), 0)
        del ts

    def test_a_symbolic_link_is_not_leased_ahead(self):
        m = self.shards(8, [0, 1, 3, 4, 5, 6, 7], links={2: "s7.npy"})
        self.assertTrue(os.path.islink(m.path("s2.npy")))
        ts = [self.mapped(m, i) for i in range(2)]
        self.idle()
        self.assertEqual(set(self.kept()), {"s0.npy", "s1.npy", "s3.npy", "s4.npy"})
        del ts

    def test_a_lease_ahead_ends_no_lease_a_move_took(self):
        """With MAX_LEASES kept, a lease ahead is given up rather than
        end (least recently used first) one a move took."""
        torch = self.torch
        m = self.shards(8, range(8))
        self.addCleanup(setattr, self.moves, "MAX_LEASES", self.moves.MAX_LEASES)
        self.moves.MAX_LEASES = 2
        t0 = self.mapped(m, 0)
        self.assertSame(t0.to(torch.float64), _plain(lambda: t0.to(torch.float64)))
        t1 = self.mapped(m, 1)
        self.idle()
        self.assertEqual(set(self.kept()), {"s0.npy", "s1.npy"})
        self.assertSame(t1.to(torch.float64), _plain(lambda: t1.to(torch.float64)))
        self.assertIn("s1.npy", self.kept())

    def test_a_file_not_leased_ahead_is_judged_by_its_mapping(self):
        """A file looked at ahead but not leased (not resident) leaves no
        identity behind: changed later and mapped by code nobody hooked
        (found by reading the maps), its moves are served."""
        import mmap

        import numpy as np

        torch = self.torch
        m = self.shards(8, [0, 1])
        ts = [self.mapped(m, i) for i in range(2)]
        self.idle()
        self.assertNotIn("s2.npy", self.kept())
        st = os.stat(m.path("s2.npy"))
        np.save(os.path.join(m.src, "s2.npy"), np.full(1024, 42, dtype=np.float32))
        os.utime(os.path.join(m.src, "s2.npy"), ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
        with open(m.path("s2.npy"), "rb") as f:
            self.assertNotEqual(os.fstat(f.fileno()).st_mtime_ns, st.st_mtime_ns, "the mount did not see the change")
            mm = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
        t = torch.from_numpy(np.frombuffer(mm, dtype=np.uint8))
        self.maps.dirty = True  # the next miss reads /proc/self/maps
        self.A.reset()
        self.assertSame(t.to(torch.float64), _plain(lambda: t.to(torch.float64)))
        self.assertEqual(self.A.fallbacks(), {})
        del t, ts

    def test_nothing_is_leased_ahead_after_disable(self):
        """A hooked call held by reference (from torch import from_file)
        still maps after disable(): nothing is leased ahead for it."""
        torch = self.torch
        m = self.shards(8, range(8))
        from_file = torch.from_file
        self.A.disable()
        self.addCleanup(self.A.enable)
        ts = [from_file(m.path("s%d.npy" % i), shared=False, size=1024, dtype=torch.float32) for i in range(2)]
        self.idle()
        self.assertEqual(self.kept(), {})
        del ts

    def test_a_thread_that_cannot_start_fails_no_mapping(self):
        """Where no thread can be had, mapping still works (nothing is
        leased ahead), and a later mapping starts the worker."""
        import threading

        m = self.shards(8, range(8))
        self.idle()
        self.ahead._jobs._reset()  # the running worker waits on a queue nobody fills now
        start = threading.Thread.start

        def refuse(thread):
            raise RuntimeError("can't start new thread")
        threading.Thread.start = refuse
        try:
            ts = [self.mapped(m, i) for i in range(2)]
        finally:
            threading.Thread.start = start
        self.assertEqual([float(t[0]) for t in ts], [0.0, 1.0])
        self.assertIsNone(self.ahead._jobs._thread)
        self.assertEqual(self.kept(), {})
        ts += [self.mapped(m, 2), self.mapped(m, 3)]  # the worker saw neither s0 nor s1
        self.idle()
        self.assertEqual(set(self.kept()), {"s2.npy", "s3.npy", "s4.npy", "s5.npy", "s6.npy"})
        del ts

    def test_a_lease_ahead_during_a_move_takes_no_second_lease(self):
        """The worker's lease of a file the loop's move is leasing at that
        moment is not taken: one lease. The interleaving is forced (the
        move's request runs the worker's lease of the file first)."""
        import threading

        from gdsfs.autoload import _serve

        torch = self.torch
        m = self.shards(4, range(4))
        self.ahead.AHEAD = 0  # no worker: the interleaving below stands in for it
        t1 = self.mapped(m, 1)
        target = m.path("s1.npy")
        real, calls = _serve.acquire, []

        def acquire(path, *a, **k):
            calls.append(path)
            if threading.current_thread() is threading.main_thread() and path == target:
                th = threading.Thread(target=self.moves.lease_ahead, args=(path,))
                th.start()
                th.join()
            return real(path, *a, **k)

        _serve.acquire = acquire
        self.addCleanup(setattr, _serve, "acquire", real)
        self.assertSame(t1.to(torch.float64), _plain(lambda: t1.to(torch.float64)))
        self.assertEqual(calls.count(target), 1, "a lease ahead and a move of one file both leased it")

    def test_leases_ahead_do_not_cost_a_move_its_kept_lease(self):
        """Leases ahead fill the uid's bound on held bytes; a move of
        another file refused for it gives back the leases ahead no move
        used first, and keeps the lease a move took."""
        import numpy as np

        torch = self.torch
        m = start_mount(self, device="host", sets=("ipc.max_held_per_uid=300KiB", "ipc.cache_headroom=0"))
        os.mkdir(os.path.join(m.src, "other"))
        for i in range(6):
            np.save(os.path.join(m.src, "s%d.npy" % i), np.full(16384, i, dtype=np.float32))  # 64 KiB
        np.save(os.path.join(m.src, "other", "x.npy"), np.full(16384, 9, dtype=np.float32))
        subprocess.run([_support.gdsfs_bin()[0], "warmup", "--wait"] + [m.path("s%d.npy" % i) for i in range(6)],
                       check=True, stdout=subprocess.DEVNULL)
        self.assertEqual(m.wait_leases(0), 0)
        t0 = self.mapped(m, 0)
        self.assertSame(t0.to(torch.float64), _plain(lambda: t0.to(torch.float64)))
        s0 = self.kept()["s0.npy"]
        t1 = self.mapped(m, 1)  # leases s1, s2, s3 ahead (s4: the bound)
        self.idle()
        x = torch.from_numpy(np.load(m.path("other/x.npy"), mmap_mode="r"))
        self.assertSame(x.to(torch.float64), _plain(lambda: x.to(torch.float64)))
        self.assertEqual(self.kept().get("s0.npy"), s0, "a lease a move took was ended for room leases ahead held")
        self.assertEqual(self.A.fallbacks(), {})
        del t1

    def test_release_leaves_no_lease_ahead(self):
        """release() (disable(), exit) stops the worker's queued work and
        waits for a lease in progress: nothing is leased after it."""
        m = self.shards(8, range(8))
        ts = [self.mapped(m, i) for i in range(4)]
        self.moves.release()
        self.idle()
        self.assertEqual(self.kept(), {})
        self.assertEqual(m.wait_leases(0), 0)
        del ts


if __name__ == "__main__":
    unittest.main()
