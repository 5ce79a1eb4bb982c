"""The lease protocol's transcripts (proto/testdata, described in
proto/PROTOCOL.md), replayed by the Python client's tests: against a fake
daemon (test_unit: the client's requests must be the transcript's) and
against a real daemon (test_leases: its answers must match). The Go tests
replay the same files with the same rules (internal/testkit/golden)."""

import errno as errno_mod
import json
import os
import threading

from _support import REPO, start_mount, tmpdir


class golden:
    """The lease protocol's transcripts, replayed by the Python client's
    tests: against a fake daemon (the client's requests must be the
    transcript's) and against a real daemon (its answers must match). The
    Go tests replay the same files (internal/testkit/golden has the same rules)."""

    DIR = os.path.join(REPO, "proto", "testdata")

    @staticmethod
    def load(path):
        setup, steps = None, []
        with open(path) as f:
            for n, line in enumerate(f, 1):
                line = line.strip()
                if not line or line.startswith("#"):
                    continue
                d = json.loads(line)
                if setup is None:
                    setup = d["setup"]
                    continue
                d["line"] = n
                steps.append(d)
        return setup, steps

    @staticmethod
    def content(seed, n):
        return bytes((i * 7 + (i >> 8) + seed * 31) & 0xFF for i in range(n))

    @staticmethod
    def _binding(s):
        return isinstance(s, str) and (s == "$epoch" or (s.startswith("$id:") and len(s) > 4))

    @classmethod
    def match(cls, pattern, actual, b, where):
        """None, or why actual does not match pattern."""
        if isinstance(pattern, dict):
            if not isinstance(actual, dict):
                return "%s: want an object, got %r" % (where, actual)
            extra = set(actual) - set(pattern)
            if extra:
                return "%s: unexpected keys %s" % (where, sorted(extra))
            for k, pv in pattern.items():
                if k not in actual:
                    return "%s: missing key %r" % (where, k)
                why = cls.match(pv, actual[k], b, "%s.%s" % (where, k))
                if why:
                    return why
            return None
        if isinstance(pattern, list):
            if not isinstance(actual, list) or len(actual) != len(pattern):
                return "%s: want %d items, got %r" % (where, len(pattern), actual)
            for i, (p, a) in enumerate(zip(pattern, actual)):
                why = cls.match(p, a, b, "%s[%d]" % (where, i))
                if why:
                    return why
            return None
        if pattern == "$text":
            return None if isinstance(actual, str) and actual else "%s: want a non-empty string, got %r" % (where, actual)
        if cls._binding(pattern):
            if isinstance(actual, bool) or not isinstance(actual, int) or actual <= 0:
                return "%s: want a positive integer for %s, got %r" % (where, pattern, actual)
            if pattern in b and b[pattern] != actual:
                return "%s: %s was %r, now %r" % (where, pattern, b[pattern], actual)
            b[pattern] = actual
            return None
        if pattern != actual or type(pattern) is not type(actual):
            return "%s: want %r, got %r" % (where, pattern, actual)
        return None

    @classmethod
    def fill(cls, v, b, counter):
        if isinstance(v, dict):
            return {k: cls.fill(e, b, counter) for k, e in v.items()}
        if isinstance(v, list):
            return [cls.fill(e, b, counter) for e in v]
        if v == "$text":
            return "text"
        if cls._binding(v):
            if v not in b:
                counter[0] += 1
                b[v] = counter[0]
            return b[v]
        return v

    @staticmethod
    def paths(req):
        return [req["path"]] if "path" in req else list(req.get("paths") or [])

    # -- the client against a fake daemon --------------------------------

    @classmethod
    def replay_client(cls, tc, path):
        import array
        import socket as _socket

        import gdsfs

        setup, steps = cls.load(path)
        name = os.path.basename(path)
        root = os.path.realpath(tmpdir("gdsfs-golden-"))
        sock = os.path.join(root, "fake.sock")
        files = {rel: cls.content(f["seed"], f["size"]) for rel, f in setup["files"].items()}
        lock = threading.Lock()
        errors = []
        ls = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        ls.bind(sock)
        ls.listen(4)
        ls.settimeout(10)


        def memfds(req, ans):
            grants = ans.get("files") if "files" in ans else [ans]
            out = []
            for p, g in zip(cls.paths(req), grants):
                off = 0
                with lock:
                    data = files.get(p, b"")
                for ch in g.get("chunks") or []:
                    fd = os.memfd_create("golden", os.MFD_CLOEXEC)
                    os.ftruncate(fd, ch["len"])
                    os.pwrite(fd, data[off:off + ch["len"]], 0)
                    off += ch["len"]
                    out.append(fd)
            return out

        def serve():
            b, counter, conn, buf = {}, [100], None, b""
            conns = []
            try:
                for st in steps:
                    if st.get("server_only"):
                        continue
                    where = "%s:%d" % (name, st["line"])
                    if st.get("step") == "connect":
                        conn, _ = ls.accept()
                        conn.settimeout(10)
                        conns.append(conn)
                        buf = b""
                        continue
                    if st.get("step") == "change":
                        with lock:
                            files[st["file"]] = cls.content(st["seed"], st["size"])
                        continue
                    while b"\n" not in buf:
                        d = conn.recv(65536)
                        if not d:
                            raise AssertionError("%s: the client closed the connection instead of sending" % where)
                        buf += d
                    line, _, buf = buf.partition(b"\n")
                    got = json.loads(line)
                    want = cls.fill(st["send"], b, counter)
                    if got != want:
                        raise AssertionError("%s: the client sent %s, want %s" % (where, got, want))
                    ans = cls.fill(st["expect"], b, counter)
                    fds = memfds(st["send"], ans)
                    data = (json.dumps(ans) + "\n").encode()
                    try:
                        if fds:
                            conn.sendmsg([data], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, array.array("i", fds))])
                        else:
                            conn.sendall(data)
                    except OSError:
                        if got.get("op") != "release":  # clients never wait for a release's answer
                            raise
                    finally:
                        for fd in fds:
                            os.close(fd)
            except BaseException as e:
                errors.append(e)
            finally:
                for c in conns:
                    c.close()

        th = threading.Thread(target=serve, daemon=True)
        th.start()
        from gdsfs import _mount

        saved_mountinfo = _mount.MOUNTINFO
        _mount.MOUNTINFO = fake_mount(root)  # root is a gdsfs mount to the client: paths are sent relative to it
        leases = {}
        saved_device = os.environ.get("GDSFS_DEVICE")
        os.environ["GDSFS_DEVICE"] = "none"  # transcripts name devices explicitly
        try:
            for st in steps:
                call = st.get("client")
                if not call or st.get("server_only"):
                    continue
                words = call.split()
                kw, key = {}, (lambda w: w)
                if words[-1].startswith("device="):
                    dev = words.pop()[len("device="):]
                    kw, key = {"device": dev}, (lambda w, dev=dev: w + " device=" + dev)
                op, args = words[0], [os.path.join(root, p) for p in words[1:]]
                try:
                    if op == "open":
                        leases[key(words[1])] = gdsfs.open(args[0], socket=sock, timeout=20, **kw)
                    elif op == "open_many":
                        for w, l in zip(words[1:], gdsfs.open_many(args, socket=sock, timeout=20, **kw)):
                            leases[key(w)] = l
                    elif op == "close":
                        leases.pop(key(words[1])).close()
                    elif op == "stat":
                        st_ = gdsfs.stat(args[0], socket=sock, timeout=20)
                        with lock:
                            tc.assertEqual(st_["size"], len(files[words[1]]))
                    elif op == "wait":  # wait P STATE,STATE MS
                        st_ = gdsfs.wait(args[0], words[2].split(","), timeout=int(words[3]) / 1000.0, socket=sock)
                        with lock:
                            tc.assertEqual(st_["size"], len(files[words[1]]))
                    elif op == "wait_stat":  # wait_stat KEY VALUE MS
                        gdsfs.wait_stat(root, words[1], int(words[2]), timeout=int(words[3]) / 1000.0, socket=sock)
                    else:
                        tc.fail("%s:%d: unknown client call %r" % (name, st["line"], call))
                except OSError as e:
                    want = st.get("client_err")
                    if errors:
                        raise errors[0]
                    tc.assertTrue(want and e.errno == getattr(errno_mod, want),
                                  "%s:%d %s: %r (want %s)" % (name, st["line"], call, e, want))
                    continue
                tc.assertFalse(st.get("client_err"), "%s:%d %s succeeded" % (name, st["line"], call))
                for w in words[1:]:
                    if op.startswith("open"):
                        with lock:
                            tc.assertEqual(leases[key(w)].read(), files[w], "%s:%d: bytes of %s" % (name, st["line"], w))
        finally:
            _mount.MOUNTINFO = saved_mountinfo
            if saved_device is None:
                os.environ.pop("GDSFS_DEVICE", None)
            else:
                os.environ["GDSFS_DEVICE"] = saved_device
            for l in leases.values():
                l.close()
            gdsfs.disconnect()
            th.join(15)
            ls.close()
        tc.assertFalse(th.is_alive(), "%s: the fake daemon did not reach the transcript's end" % name)
        if errors:
            raise errors[0]

    # -- a real daemon ----------------------------------------------------

    @classmethod
    def replay_server(cls, tc, path):
        """Replay every step against a real daemon (host backend) through
        this client's framing (gdsfs._proto.Conn)."""
        from gdsfs._proto import Conn

        setup, steps = cls.load(path)
        name = os.path.basename(path)
        # A fixed capacity, as ipc's replay of the same transcripts has: a
        # share of the memory free at start, read once per device, can give
        # two host devices different capacities on a busy machine, and
        # placement by room ("where there is most room") would then depend
        # on that (devices.jsonl could get host1 for host0).
        sets = ["ipc.sharing=" + setup["sharing"], "ipc.max_request=%d" % setup["max_request"],
                "staging.prefetch=manual", "staging.capacity=64MiB"]
        if "cache_headroom" in setup:
            sets.append("ipc.cache_headroom=" + setup["cache_headroom"])
        if setup.get("host_devices"):
            sets.append("staging.host_devices=%d" % setup["host_devices"])
        m = start_mount(tc, sets=sets, chunk_size=str(setup["chunk_size"]))
        for rel, f in setup["files"].items():
            m.write(rel, cls.content(f["seed"], f["size"]))
        for d in setup.get("dirs", []):
            os.makedirs(os.path.join(m.src, d), exist_ok=True)
        for p in setup.get("fifos", []):
            os.mkfifo(os.path.join(m.src, p))
        b, counter, conn, conns = {}, [0], None, []
        mtime = [2_000_000_000]
        try:
            for st in steps:
                where = "%s:%d" % (name, st["line"])
                if st.get("step") == "connect":
                    conn = Conn(m.sock, timeout=20)
                    conns.append(conn)
                    continue
                if st.get("step") == "change":
                    p = m.write(st["file"], cls.content(st["seed"], st["size"]))
                    mtime[0] += 1
                    os.utime(os.path.join(m.src, st["file"]), (mtime[0], mtime[0]))
                    continue
                if "send_raw" in st:
                    conn._sock.sendall(st["send_raw"].encode())
                    raw, fds, _ = conn._read_line("raw")
                    resp = json.loads(raw)
                else:
                    resp, fds = conn.roundtrip(cls.fill(st["send"], b, counter))
                for fd in fds:
                    os.close(fd)
                why = cls.match(st["expect"], resp, b, where)
                tc.assertIsNone(why, "%s\n  answer: %s" % (why, resp))
                tc.assertEqual(len(fds), st.get("fds", 0), "%s: descriptors" % where)
                if st.get("closed"):
                    tc.assertEqual(conn._sock.recv(1), b"", "%s: the connection stayed open" % where)
        finally:
            for c in conns:
                c.close()


def fake_mount(d):
    """A mountinfo file in which d is a gdsfs mount of this process's euid."""
    esc = d.replace("\\", r"\134").replace(" ", r"\040").replace("\t", r"\011").replace("\n", r"\012")
    path = os.path.join(tmpdir("gdsfs-mountinfo-"), "mountinfo")
    with open(path, "w") as f:
        f.write("22 1 8:1 / / rw - ext4 /dev/sda1 rw\n"
                "40 22 0:99 / %s rw - fuse.gdsfs /src rw,user_id=%d,group_id=0\n" % (esc, os.geteuid()))
    return path
