"""Leases against a real daemon on the host backend (root, /dev/fuse):
repeat leases, batches, the golden transcripts, and what a lease may never
do: hand out old bytes, be written through in shared mode, stay held when
its descriptors were dropped, leak descriptors or mappings."""

import errno
import os
import signal
import subprocess
import unittest

from _golden import golden
from _support import child, start_mount
from test_host import CHUNK, blob

import gdsfs


def _own_gdsfs_descriptors():
    """This process's memfd descriptors and memfd mappings (what leases
    leave behind if they leak), and its unix sockets."""
    fds = socks = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink("/proc/self/fd/" + fd)
        except OSError:
            continue
        fds += link.startswith("/memfd:")
        socks += link.startswith("socket:")
    with open("/proc/self/maps") as f:
        maps = sum("/memfd:" in line for line in f)
    return {"memfds": fds, "sockets": socks, "memfd_maps": maps}


class FastPathTests(unittest.TestCase):
    """Repeat leases, batches, the golden transcripts, and what a lease may
    never do: hand out old bytes, be written through in shared mode, stay
    held when its descriptors were dropped, leak."""

    def setUp(self):
        self.m = start_mount(self, chunk_size="64KiB")
        self.addCleanup(gdsfs.disconnect)

    def test_repeat_lease_reuses_mapping(self):
        data = blob(3 * CHUNK + 5, 20)
        p = self.m.write("r.bin", data)
        with gdsfs.open(p) as first:
            ptr = first.ptr
            self.assertFalse(first.reused)
        with gdsfs.open(p) as again:
            self.assertTrue(again.reused, "an unchanged file kept mapped is leased without descriptors")
            self.assertEqual((again.ptr, again.generation), (ptr, first.generation))
            self.assertEqual(again.read(), data)
        st = self.m.stats()
        self.assertEqual(st["lease_held_files"], 1, "the kept mapping's connection still holds the file")
        gdsfs.disconnect()
        self.assertEqual(self.m.wait_stat("lease_held_bytes", 0), 0)

    def test_kept_mapping_never_old_bytes(self):
        p = self.m.write("c.bin", blob(2 * CHUNK, 21))
        for i in range(4):
            with gdsfs.open(p):
                pass
            want = blob(CHUNK + 100 * i + 1, 30 + i)
            self.m.write("c.bin", want)
            src = os.path.join(self.m.src, "c.bin")
            os.utime(src, ns=(0, 10**18 + i * 10**9))
            with gdsfs.open(p) as l:
                self.assertFalse(l.reused)
                self.assertEqual((l.size, l.read()), (len(want), want), "round %d: old bytes after a change" % i)

    def test_name_not_utf8_is_leased_as_itself(self):
        """A file whose name is not UTF-8 is leased as itself or not at
        all, never as the file whose name has U+FFFD for its bad bytes
        (which another user may make beside it)."""
        own, twin = blob(CHUNK + 7, 40), blob(CHUNK + 7, 41)
        src = os.fsencode(self.m.src)
        for name, data in ((b"m-\xff.bin", own), (b"m-\xef\xbf\xbd.bin", twin)):
            with open(os.path.join(src, name), "wb") as f:
                f.write(data)
        p = os.path.join(self.m.mnt, os.fsdecode(b"m-\xff.bin"))
        try:
            lease = gdsfs.open(p)
        except OSError:
            return  # refused: allowed
        with lease:
            self.assertEqual(lease.read(), own, "leased the bytes of m-\ufffd.bin")

    def test_open_many(self):
        datas = [blob(1000 + 7000 * i, 40 + i) for i in range(12)]
        paths = [self.m.write("m%02d.bin" % i, d) for i, d in enumerate(datas)]
        before = self.m.stats()["ipc_connections"]
        leases = gdsfs.open_many(paths)
        self.assertEqual(self.m.stats()["ipc_connections"], before + 1, "one connection for the batch")
        for l, d in zip(leases, datas):
            self.assertEqual(l.read(), d)
            l.close()
        again = gdsfs.open_many(paths)
        self.assertTrue(all(l.reused for l in again))
        self.assertEqual(self.m.stats()["ipc_connections"], before + 1)
        for l in again:
            l.close()
        with self.assertRaises(FileNotFoundError):
            gdsfs.open_many(paths[:2] + [self.m.path("none.bin")])
        gdsfs.disconnect()
        self.assertEqual(self.m.wait_stat("lease_held_bytes", 0), 0)
        self.assertEqual(self.m.wait_leases(0), 0)

    def test_epoch_over_more_files_than_were_kept(self):
        """A second pass over 320 files in 40 batches (more batches than
        the connections a process keeps, and more files than 256, so a
        client keeping fewer would make every lease of an epoch over them a
        fresh one) is leased again from kept mappings, all on the one
        connection the batches were leased on."""
        datas = [blob(100 + i, 200 + i) for i in range(320)]
        paths = [self.m.write("e%03d.bin" % i, d) for i, d in enumerate(datas)]
        before = self.m.stats()["ipc_connections"]
        for rnd in range(2):
            for k in range(0, len(paths), 8):
                leases = gdsfs.open_many(paths[k:k + 8])
                for l, d in zip(leases, datas[k:k + 8]):
                    self.assertEqual(l.read(), d)
                    if rnd:
                        self.assertTrue(l.reused, "pass 2, %s: not leased from the kept mapping" % l.path)
                    l.close()
        self.assertEqual(self.m.stats()["ipc_connections"], before + 1, "one connection for every batch")
        gdsfs.disconnect()
        self.assertEqual(self.m.wait_stat("lease_held_bytes", 0), 0)

    def test_fresh_leases_after_the_pooled_connection_ended(self):
        """The connection a process keeps mappings on ended from the
        daemon's side (as at a restart): the next fresh lease, one file or
        a batch, is made on a new connection instead of failing."""
        import socket as socket_mod
        from gdsfs import _registry

        paths = [self.m.write("pe%d.bin" % i, blob(4096 + i, 600 + i)) for i in range(3)]
        for l in gdsfs.open_many(paths[:1]):
            l.close()  # kept on the pooled connection
        for call, p in ((lambda p: gdsfs.open_many([p])[0], paths[1]), (gdsfs.open, paths[2])):
            pool = [h for hs in _registry.registry.pools.values() for h in hs if not h.conn.closed]
            self.assertEqual(len(pool), 1)
            pool[0].conn._sock.shutdown(socket_mod.SHUT_RDWR)  # the daemon sees it end
            l = call(p)
            self.assertEqual(l.read(), blob(4096 + paths.index(p), 600 + paths.index(p)))
            self.assertIsNot(l._m.holder, pool[0])
            l.close()

    def test_unmapped_files_are_dropped_from_the_batch_connection(self):
        """Kept mappings past the client's bound are unmapped and dropped
        on the connection that stays open for the rest: the daemon holds
        only what is still mapped."""
        from gdsfs import _registry

        paths = [self.m.write("dr%d.bin" % i, blob(70 + i, 400 + i)) for i in range(10)]
        old = _registry.MAX_IDLE
        _registry.MAX_IDLE = 4
        self.addCleanup(setattr, _registry, "MAX_IDLE", old)
        for l in gdsfs.open_many(paths):
            l.close()
        self.assertEqual(self.m.wait_stat("lease_held_files", 4), 4, "unmapped files still held")
        self.assertEqual(self.m.wait_stat("ipc_open_connections", 1), 1)  # the asking one left out
        again = gdsfs.open_many(paths[-4:])
        self.assertTrue(all(l.reused for l in again), "the kept mappings were dropped too")
        for l in again:
            l.close()
        gdsfs.disconnect()
        self.assertEqual(self.m.wait_stat("lease_held_files", 0), 0)

    def _each_on_a_connection_of_its_own(self, paths):
        """Lease and close each path while every connection of the pool is
        in use (marked busy, as another thread's request would), so each is
        leased on a new connection; returns the holders, still busy (the
        caller gives them back with registry.checkin)."""
        from gdsfs import _registry

        busy = []
        for p in paths:
            with gdsfs.open(p) as l:
                h = l._m.holder
            with _registry.registry.lock:
                h.busy += 1
            busy.append(h)
        return busy

    def test_kept_connections_are_bounded(self):
        """Kept mappings hold their connections; past the client's bound
        the oldest are let go, so a process whose requests ran on many
        connections at once does not keep them all."""
        from gdsfs import _registry

        paths = [self.m.write("k%d.bin" % i, blob(50 + i, 300 + i)) for i in range(6)]
        old = _registry.MAX_CONNS
        _registry.MAX_CONNS = 3
        self.addCleanup(setattr, _registry, "MAX_CONNS", old)
        busy = self._each_on_a_connection_of_its_own(paths)
        self.assertEqual(len({id(h.conn) for h in busy}), 6)
        for h in busy:
            _registry.registry.checkin(h)
        self.assertEqual(self.m.wait_stat("ipc_open_connections", 3), 3)
        with gdsfs.open(paths[-1]) as l:
            self.assertTrue(l.reused, "the newest kept mapping is still there")

    def test_file_after_file_on_one_connection(self):
        """A process that leased file after file and closed each keeps them
        mapped on one connection, not a share of the uid's
        ipc.max_connections_per_uid, and leases them again from it."""
        from gdsfs import _registry

        paths = [self.m.write("few%d.bin" % i, blob(64 + i, 900 + i)) for i in range(_registry.MAX_CONNS + 8)]
        for p in paths:
            with gdsfs.open(p):
                pass
        self.assertEqual(self.m.stats()["ipc_open_connections"], 1)
        self.assertEqual(self.m.stats()["lease_held_files"], len(paths))
        for p in paths:
            with gdsfs.open(p) as l:
                self.assertTrue(l.reused, p)

    def test_many_releases_without_a_request(self):
        """Thousands of releases in a row with no request between them (a
        process ending many leases at once): their answers are read as
        they go, so the daemon never stops reading and the connection, and
        the lease still open on it, stay."""
        p = self.m.write("flood.bin", blob(4096, 77))
        c = gdsfs._proto.Conn(self.m.sock)
        self.addCleanup(c.close)
        resp, fds = c.request({"op": "acquire", "path": "flood.bin"})
        for fd in fds:
            os.close(fd)
        for i in range(20000):
            c.release(resp["lease"] + 1 + i, resp["epoch"])  # ids never granted: answered, not fatal
            self.assertFalse(c.closed, "the connection failed at release %d" % i)
        hello, _ = c.request({"op": "hello", "version": 1})
        self.assertTrue(hello.get("ok"), hello)
        self.assertEqual(self.m.stats()["lease_held_files"], 1, "the open lease was ended")
        self.assertEqual(os.path.getsize(p), 4096)

    def test_forked_child_does_not_pin_kept_leases(self):
        """A forked child closes its copies of the parent's connections:
        when the parent drops its kept mappings the daemon holds nothing,
        while the child still runs."""
        p = self.m.write("pin.bin", blob(4096, 950))
        with gdsfs.open(p):
            pass  # kept mapped, its connection open
        self.assertEqual(self.m.wait_stat("lease_held_files", 1), 1)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(w)
                os.read(r, 1)  # until the parent is done
            finally:
                os._exit(0)
        os.close(r)
        try:
            gdsfs.disconnect()
            self.assertEqual(self.m.wait_stat("lease_held_files", 0), 0, "the child's copy of the connection holds the file")
        finally:
            os.close(w)
            os.waitpid(pid, 0)

    def test_a_file_mounted_over_in_a_remembered_directory(self):
        """A file of the mount with another filesystem's file bind-mounted
        over it, in a directory the client has found the daemon for, is
        not sent to that daemon (whose SOURCE file is not what a plain open
        of the path reads): gdsfs.open and open_many refuse it as a path
        on no gdsfs mount, as they do when nothing is remembered, and the
        autoloader finds no mount to report it to."""
        from _support import loud, tmpdir
        from gdsfs.autoload import _report

        if os.geteuid() != 0:
            self.skipTest(loud("SKIPPED: a bind mount needs root"))
        a = self.m.write("mo/a.bin", blob(4096, 990))
        x = self.m.write("mo/x.bin", blob(4096, 991))
        other = os.path.join(tmpdir(), "other.bin")
        with open(other, "wb") as f:
            f.write(blob(4096, 992))
        subprocess.run(["mount", "--bind", other, x], check=True)
        self.addCleanup(subprocess.run, ["umount", x], check=True)
        for remembered in (False, True):
            if remembered:
                with gdsfs.open(a) as l:  # the daemon of mo/ is remembered now
                    self.assertEqual(l.read(), blob(4096, 990))
            with self.assertRaises(gdsfs.NotMountedError, msg="remembered=%s" % remembered):
                gdsfs.open(x)
            with self.assertRaises(gdsfs.NotMountedError, msg="remembered=%s" % remembered):
                gdsfs.open_many([a, x])
            self.assertIsNone(_report.mount_target(x), "remembered=%s" % remembered)

    def test_repointed_link_serves_the_new_target(self):
        """`latest` repointed from v1 to v2 serves v2's bytes; repointed to a
        directory on no gdsfs mount, the file is not leased."""
        from _support import tmpdir

        v1, v2 = blob(4096, 960), blob(4096, 961)
        self.m.write("v1/ckpt.pt", v1)
        self.m.write("v2/ckpt.pt", v2)
        d = tmpdir()
        os.mkdir(os.path.join(d, "plain"))
        latest = os.path.join(d, "latest")

        def point(to):
            os.symlink(to, latest + ".new")
            os.rename(latest + ".new", latest)

        for to, want in ((self.m.path("v1"), v1), (self.m.path("v2"), v2), (self.m.path("v1"), v1)):
            point(to)
            with gdsfs.open(os.path.join(latest, "ckpt.pt")) as l:
                self.assertEqual(l.read(), want, to)
        point(os.path.join(d, "plain"))
        with self.assertRaises(gdsfs.NotMountedError):
            gdsfs.open(os.path.join(latest, "ckpt.pt"))

    def test_dot_dot_after_a_link_leases_the_file_a_plain_open_reads(self):
        """link/../f, where link leads into another directory, names that
        directory's parent's f for the kernel: gdsfs.open and open_many
        lease that file, not the f beside the link."""
        self.m.write("dd/sub/f", blob(4096, 970))
        self.m.write("dd/f", blob(4096, 971))
        os.makedirs(os.path.join(self.m.src, "dd", "sub", "deep"), exist_ok=True)
        os.symlink("sub/deep", os.path.join(self.m.src, "dd", "link"))
        p = self.m.path("dd/link") + "/../f"
        with open(p, "rb") as f:
            want = f.read()
        self.assertEqual(want, blob(4096, 970), "the kernel's walk")
        with gdsfs.open(p) as l:
            self.assertEqual(l.read(), want)
        ls = gdsfs.open_many([p, self.m.path("dd/f")])
        try:
            self.assertEqual([l.read() for l in ls], [want, blob(4096, 971)])
        finally:
            for l in ls:
                l.close()
        old = os.getcwd()
        os.chdir(self.m.path("dd"))
        try:
            with gdsfs.open("link/../f") as l:
                self.assertEqual(l.read(), want, "relative")
        finally:
            os.chdir(old)

    def test_kept_mappings_dropped_at_the_connection_limit(self):
        """A lease refused because the uid is at
        ipc.max_connections_per_uid makes the client drop the mappings it
        kept for repeat leases; their connections close once no request
        uses them."""
        from gdsfs import _registry
        from _support import Mount

        m = Mount(sets=["ipc.max_connections_per_uid=5"])
        self.addCleanup(m.stop)
        paths = [m.write("lim%d.bin" % i, blob(4096, 980 + i)) for i in range(5)]
        busy = self._each_on_a_connection_of_its_own(paths[:4])
        kept = [_registry.registry.files[k] for k in list(_registry.registry.files) if k[0] == m.sock]
        self.assertEqual(len(kept), 4)
        watch = gdsfs._proto.Conn(m.sock)  # the uid's fifth: at its limit
        self.addCleanup(watch.close)
        watch.request({"op": "hello", "version": 1})  # answered: admitted, counted
        with self.assertRaises(OSError) as cm:
            gdsfs.open(paths[4])
        self.assertEqual(cm.exception.errno, errno.EMFILE, cm.exception)
        self.assertEqual([k.mapping for k in kept], [None] * 4, "kept mappings were left")
        self.assertFalse([k for k in _registry.registry.idle if k.holder.conn.path == m.sock])
        for h in busy:
            _registry.registry.checkin(h)
        self.assertEqual([k.holder.conn.closed for k in kept], [True] * 4, "connections holding nothing were left open")
        # the daemon ends them as it reads their end (the asking one left out)
        resp, _ = watch.request({"op": "wait_stat", "key": "ipc_open_connections", "value": 0, "timeout_ms": 15000})
        self.assertTrue(resp.get("ok"), resp)
        with gdsfs.open(paths[4]) as l:
            self.assertEqual(l.read(), blob(4096, 984))

    def test_batch_mapping_failure_releases_the_rest(self):
        """A batch whose second file fails to map releases that grant and
        the ones after it: nothing stays leased (not even on the connection
        the first file's kept mapping holds open)."""
        from gdsfs import _registry

        paths = [self.m.write("mf%d.bin" % i, blob(4096 + i, 500 + i)) for i in range(3)]
        real, calls = _registry.map_grant, [0]

        def flaky(grant, fds, what):
            calls[0] += 1
            if calls[0] == 2:
                _registry._close_fds(fds)
                raise OSError(12, "simulated mapping failure")
            return real(grant, fds, what)

        _registry.map_grant = flaky
        try:
            with self.assertRaises(OSError):
                gdsfs.open_many(paths)
        finally:
            _registry.map_grant = real
        self.assertEqual(self.m.wait_leases(0), 0)

    def test_leased_bounds_the_files_ahead(self):
        """gdsfs.torch.leased keeps at most ahead + batch files leased and
        not yet yielded, however slow the caller (handing whole batches
        between its threads first let it run a batch further). The
        producer's wait for room is the event: once it waits, exactly two
        batches were leased; a third open_many before that fails at once."""
        import threading
        import types

        import gdsfs.torch as gt

        paths = [self.m.write("la%02d.bin" % i, blob(4096, 600 + i)) for i in range(64)]
        calls, decided = [], threading.Event()

        class Watched(threading.Condition):
            def wait(self, timeout=None):
                decided.set()  # the producer found no room for its next batch
                return super().wait(timeout)

        real = gt.open_many

        def counted(part, **kw):
            calls.append(len(part))
            if len(calls) > 2:
                decided.set()
            return real(part, **kw)

        gt.open_many = counted
        self.addCleanup(setattr, gt, "open_many", real)
        # leased() makes its condition at the first next(): only that one is watched.
        gt.threading = types.SimpleNamespace(Condition=Watched, Event=threading.Event, Thread=threading.Thread)
        try:
            it = gt.leased(paths, ahead=4, transform=lambda l: l.read(16))
            self.addCleanup(it.close)
            next(it)  # its lease is closed; the rest of its batch and the next stay leased
        finally:
            gt.threading = threading
        self.assertTrue(decided.wait(30), "the producer neither waited for room nor leased further")
        self.assertEqual(calls, [4, 4], "a third batch was leased ahead")
        self.assertEqual(self.m.wait_leases(7), 7)
        it.close()
        self.assertEqual(self.m.wait_leases(0), 0)

    def test_forked_child_counts_its_own_connections(self):
        """A forked child closing leases it inherited does not count the
        parent's connections as its own."""
        from gdsfs import _registry

        paths = [self.m.write("fk%d.bin" % i, blob(4096, 700 + i)) for i in range(5)]
        held = [gdsfs.open(p) for p in paths[:4]]
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                with gdsfs.open(paths[4]):
                    pass
                for l in held:
                    l.close()
                os.write(w, str(_registry.registry.conns).encode())
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        os.close(w)
        got = os.read(r, 100).decode()
        os.close(r)
        for l in held:
            l.close()
        self.assertEqual((os.waitstatus_to_exitcode(status), got), (0, "1"), "the child holds one connection of its own")

    def test_wait_for_staging(self):
        """gdsfs.wait returns once the daemon says the file is staged, and
        raises TimeoutError when the state asked for does not come."""
        p = self.m.write("w.bin", blob(3 * CHUNK + 1, 80))
        with open(self.m.path(".gdsfs/prefetch"), "w") as f:
            f.write("w.bin\n")
        st = gdsfs.wait(p, timeout=20)
        self.assertEqual((st["state"], st["size"], st["load_path"]), ("resident", 3 * CHUNK + 1, "host"))
        q = self.m.write("never.bin", blob(100, 81))
        with self.assertRaises(TimeoutError):
            gdsfs.wait(q, until=("failed",), timeout=0.05)
        self.assertEqual(gdsfs.wait(q, until="absent", timeout=20)["state"], "absent")

    def test_golden_transcripts_against_the_daemon(self):
        """proto/testdata through this client's framing against the real
        daemon (each transcript on a mount of its own)."""
        for name in sorted(os.listdir(golden.DIR)):
            if name.endswith(".jsonl"):
                with self.subTest(transcript=name):
                    golden.replay_server(self, os.path.join(golden.DIR, name))

    def test_shared_write_faults_in_that_process_only(self):
        data = blob(2 * CHUNK, 50)
        p = self.m.write("w.bin", data)
        script = r"""
import ctypes, sys, gdsfs
l = gdsfs.open(sys.argv[1])
assert l.readonly
mv = l.memoryview()
try:
    mv[0] = 1
except TypeError:
    print("memoryview refused", flush=True)
ctypes.memset(l.ptr, 0, 16)   # a raw write through the mapping
print("written", flush=True)
"""
        proc = child(script, [p])
        out, err = proc.communicate(timeout=60)
        self.assertEqual(proc.returncode, -signal.SIGSEGV, (out, err))
        self.assertEqual(out, b"memoryview refused\n")
        with gdsfs.open(p) as l:
            self.assertEqual(l.read(), data, "the next lease has the file's bytes")

    def test_truncated_descriptors_end_the_lease(self):
        p = self.m.write("t.bin", blob(6 * CHUNK, 51))
        script = r"""
import errno, os, resource, sys, gdsfs
os.pipe()
highest = max(int(x) for x in os.listdir("/proc/self/fd"))
while True:
    fd = os.open("/dev/null", os.O_RDONLY)
    if fd > highest:
        os.close(fd)
        break
gdsfs.locate(sys.argv[1])  # nothing lazy left to open
resource.setrlimit(resource.RLIMIT_NOFILE, (highest + 4, highest + 4))
try:
    gdsfs.open(sys.argv[1])
    print("leased", flush=True)
except OSError as e:
    print(errno.errorcode.get(e.errno), flush=True)
sys.stdin.read()
"""
        proc = child(script, [p], stdin=subprocess.PIPE)
        try:
            line = proc.stdout.readline()
            self.assertEqual(line, b"EMFILE\n", proc.stderr.read1(4096) if not line else line)
            self.assertEqual(self.m.wait_leases(0), 0, "the lease stayed held while the client lives")
            self.assertEqual(self.m.wait_stat("lease_held_bytes", 0), 0)
            self.assertIsNone(proc.poll())
        finally:
            proc.stdin.close()
            proc.wait(30)
            proc.stdout.close()
            proc.stderr.close()

    def test_lease_cycles_do_not_leak(self):
        """10,000 lease cycles (repeat leases, and a file that changes every
        100) leave this process with the memfds, mappings and sockets it had,
        and the daemon holding nothing."""
        paths = [self.m.write("n%d.bin" % i, blob(CHUNK + i * 999, 60 + i)) for i in range(3)]
        for p in paths:
            with gdsfs.open(p) as l:
                l.read(0, 1)
        gdsfs.disconnect()
        before = _own_gdsfs_descriptors()
        reused = 0
        for i in range(10000):
            if i % 100 == 99:
                self.m.write("n2.bin", blob(CHUNK + 2 * 999, 1000 + i))
                os.utime(os.path.join(self.m.src, "n2.bin"), ns=(0, 10**18 + i * 10**9))
            with gdsfs.open(paths[i % 3]) as l:
                reused += l.reused
                l.read(0, 1)
        gdsfs.disconnect()
        self.assertEqual(_own_gdsfs_descriptors(), before)
        self.assertGreater(reused, 9000, "the fast path served the repeat leases")
        self.assertEqual(self.m.wait_stat("ipc_open_connections", 0), 0)
        self.assertEqual(self.m.wait_stat("lease_held_bytes", 0), 0)
        self.assertEqual(self.m.wait_leases(0), 0)


class PrivateLeaseTests(unittest.TestCase):
    def setUp(self):
        self.m = start_mount(self, chunk_size="64KiB", sets=["ipc.sharing=private"])

    def test_private_copy_is_writable_and_own(self):
        data = blob(CHUNK + 3, 70)
        p = self.m.write("p.bin", data)
        with gdsfs.open(p) as a, gdsfs.open(p) as b:
            self.assertFalse(a.readonly)
            mv = a.memoryview()
            mv[0:4] = b"\x00\x01\x02\x03"
            self.assertEqual(bytes(mv[0:4]), b"\x00\x01\x02\x03")
            self.assertEqual(b.read(0, 4), data[:4], "another lease does not see the write")
            del mv
        with gdsfs.open(p) as c:
            self.assertEqual(c.read(), data)


if __name__ == "__main__":
    unittest.main()
