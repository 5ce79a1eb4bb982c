"""Test helpers: the gdsfs binary, real mounts, child processes.

Mounting tests need root and /dev/fuse; they skip loudly otherwise. The
daemon binary is $GDSFS_BIN, else built once per run with
`go build -o <tmp>/gdsfs ./cmd/gdsfs` from the repository root.
"""

import atexit
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest

TESTS = os.path.dirname(os.path.abspath(__file__))
PYDIR = os.path.dirname(TESTS)
REPO = os.path.dirname(PYDIR)
if PYDIR not in sys.path:
    sys.path.insert(0, PYDIR)

NOBODY = 65534

_lock = threading.Lock()
_bin = None  # (path, reason it is unavailable)
_tmpdirs = []


def _cleanup_tmpdirs():
    for d in _tmpdirs:
        shutil.rmtree(d, ignore_errors=True)


atexit.register(_cleanup_tmpdirs)


def tmpdir(prefix="gdsfs-py-"):
    """A temporary directory every uid may search (0755), removed at exit."""
    d = tempfile.mkdtemp(prefix=prefix)
    os.chmod(d, 0o755)
    _tmpdirs.append(d)
    return d


def loud(msg):
    sys.stderr.write("\n*** %s\n" % msg)
    sys.stderr.flush()
    return msg


def gdsfs_bin():
    """(path, None) or (None, why there is no binary)."""
    global _bin
    with _lock:
        if _bin is None:
            env = os.environ.get("GDSFS_BIN")
            if env:
                if os.access(env, os.X_OK):
                    _bin = (env, None)
                else:
                    _bin = (None, "GDSFS_BIN=%s is not an executable file" % env)
            elif shutil.which("go") is None:
                _bin = (None, "no GDSFS_BIN and no Go toolchain to build ./cmd/gdsfs")
            else:
                out = os.path.join(tmpdir("gdsfs-bin-"), "gdsfs")
                r = subprocess.run(
                    ["go", "build", "-o", out, "./cmd/gdsfs"], cwd=REPO,
                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                )
                if r.returncode != 0:
                    # A build failure is an error, not a reason to skip.
                    raise RuntimeError("go build ./cmd/gdsfs failed:\n" + r.stdout.decode(errors="replace"))
                _bin = (out, None)
        return _bin


def mount_skip_reason():
    if os.geteuid() != 0:
        return "gdsfs mount tests need root (FUSE mounts); run them as root"
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse on this machine"
    _, why = gdsfs_bin()
    return why


def require_mount(tc):
    why = mount_skip_reason()
    if why:
        tc.skipTest(loud("SKIPPED (no gdsfs mount possible): " + why))


def mounted(path):
    from gdsfs._mount import read_mountinfo

    return any(e.mountpoint == path for e in read_mountinfo())


class Mount:
    """A running `gdsfs mount` of a fresh SOURCE directory."""

    def __init__(self, device="host", sets=(), chunk_size=None):
        path, why = gdsfs_bin()
        if why:
            raise unittest.SkipTest(why)
        self.dir = tmpdir()
        self.src = os.path.join(self.dir, "src")
        self.mnt = os.path.join(self.dir, "mnt")
        self.sock = os.path.join(self.dir, "lease.sock")
        os.mkdir(self.src, 0o755)
        os.mkdir(self.mnt, 0o755)
        args = [path, "mount", "--set", "log.format=console", "--set", "ipc.socket=" + self.sock,
                "--set", "staging.device=" + device]
        if chunk_size:
            args += ["--set", "staging.chunk_size=" + chunk_size]
        for s in sets:
            args += ["--set", s]
        args += [self.src, self.mnt]
        self.log_path = os.path.join(self.dir, "daemon.log")
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while not os.path.exists(os.path.join(self.mnt, ".gdsfs", "version")):
            if self.proc.poll() is not None:
                self._log.close()
                raise AssertionError("gdsfs exited (%s) before mounting:\n%s" % (self.proc.returncode, self.log()))
            if time.monotonic() > deadline:
                self.stop()
                raise AssertionError("gdsfs mount did not come up in 30s:\n" + self.log())
            time.sleep(0.02)

    def log(self):
        try:
            with open(self.log_path, "rb") as f:
                return f.read()[-8000:].decode(errors="replace")
        except OSError:
            return ""

    def stop(self):
        """SIGTERM (as a user would), wait for exit; never leave a mount."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                subprocess.run(["umount", "-l", self.mnt], stderr=subprocess.DEVNULL)
                raise AssertionError("gdsfs did not exit on SIGTERM:\n" + self.log())
            finally:
                self._log.close()
        if mounted(self.mnt):
            subprocess.run(["umount", "-l", self.mnt], stderr=subprocess.DEVNULL)
            raise AssertionError("%s still mounted after gdsfs exited:\n%s" % (self.mnt, self.log()))

    def path(self, rel):
        return os.path.join(self.mnt, rel)

    def write(self, rel, data, mode=0o644):
        p = os.path.join(self.src, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(data)
        os.chmod(p, mode)
        return os.path.join(self.mnt, rel)

    def stats(self):
        with open(os.path.join(self.mnt, ".gdsfs", "stats.json")) as f:
            return json.load(f)

    def leases_active(self):
        return self.stats()["leases_active"]

    def wait_leases(self, n, timeout=15):
        return self.wait_stat("leases_active", n, timeout)

    def wait_stat(self, key, want, timeout=15):
        """Poll stats.json until key is want (the daemon answers releases
        and closes asynchronously); return the last value."""
        deadline = time.monotonic() + timeout
        while True:
            got = self.stats()[key]
            if got == want or time.monotonic() > deadline:
                return got
            time.sleep(0.05)


def start_mount(tc, **kw):
    """Mount for one test; stopped in the test's cleanup."""
    require_mount(tc)
    m = Mount(**kw)
    tc.addCleanup(m.stop)
    return m


_child_pkg = None


def child_pythonpath():
    """A copy of the package in a 0755 directory, importable by any uid."""
    global _child_pkg
    with _lock:
        if _child_pkg is None:
            d = tmpdir("gdsfs-pkg-")
            shutil.copytree(os.path.join(PYDIR, "gdsfs"), os.path.join(d, "gdsfs"),
                            ignore=shutil.ignore_patterns("__pycache__"))
            for root, dirs, files in os.walk(d):
                for n in dirs:
                    os.chmod(os.path.join(root, n), 0o755)
                for n in files:
                    os.chmod(os.path.join(root, n), 0o644)
            _child_pkg = d
        return _child_pkg


_uid_python = {}


def python_for(uid):
    """An interpreter uid can run: sys.executable may sit under a 0700
    home (pyenv in /root). gdsfs needs only the stdlib."""
    if uid is None:
        return sys.executable
    with _lock:
        if uid not in _uid_python:
            _uid_python[uid] = None
            cands = [sys.executable, "/usr/bin/python3", "/usr/local/bin/python3", shutil.which("python3")]
            for c in cands:
                if not c or not os.path.exists(c):
                    continue
                try:
                    r = subprocess.run([c, "-c", "import sys; assert sys.version_info >= (3, 8)"], cwd="/",
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                       preexec_fn=_dropper(uid), timeout=60)
                except (OSError, subprocess.SubprocessError):
                    continue
                if r.returncode == 0:
                    _uid_python[uid] = c
                    break
        return _uid_python[uid]


def _dropper(uid):
    def drop():
        if uid is not None:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)

    return drop


def child(script, args=(), uid=None, env=None, **kw):
    """Popen of `python -c script args...` with the package importable,
    as uid if given."""
    e = dict(os.environ)
    e["PYTHONPATH"] = child_pythonpath()
    e["PYTHONDONTWRITEBYTECODE"] = "1"
    e.update(env or {})
    py = python_for(uid)
    if py is None:
        raise unittest.SkipTest(loud("SKIPPED: no Python interpreter that uid %d may run" % uid))
    return subprocess.Popen([py, "-c", script] + list(args), env=e, cwd="/", preexec_fn=_dropper(uid),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


def have_torch():
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


# --- golden transcripts (proto/testdata, described in proto/PROTOCOL.md) ---


class golden:
    """The lease protocol's transcripts, replayed by the Python client's
    tests: against a fake daemon (the client's requests must be the
    transcript's) and against a real daemon (its answers must match). The
    Go tests replay the same files (internal/golden has the same rules)."""

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

        def under(req):
            req = dict(req)
            if "path" in req:
                req["path"] = os.path.join(root, req["path"])
            if "paths" in req:
                req["paths"] = [os.path.join(root, p) for p in req["paths"]]
            return req

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
                    want = under(cls.fill(st["send"], b, counter))
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
        leases = {}
        try:
            for st in steps:
                call = st.get("client")
                if not call or st.get("server_only"):
                    continue
                words = call.split()
                op, args = words[0], [os.path.join(root, p) for p in words[1:]]
                try:
                    if op == "open":
                        leases[words[1]] = gdsfs.open(args[0], socket=sock, timeout=20)
                    elif op == "open_many":
                        for w, l in zip(words[1:], gdsfs.open_many(args, socket=sock, timeout=20)):
                            leases[w] = l
                    elif op == "close":
                        leases.pop(words[1]).close()
                    elif op == "stat":
                        st_ = gdsfs.stat(args[0], socket=sock, timeout=20)
                        with lock:
                            tc.assertEqual(st_["size"], len(files[words[1]]))
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
                            tc.assertEqual(leases[w].read(), files[w], "%s:%d: bytes of %s" % (name, st["line"], w))
        finally:
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
        sets = ["ipc.sharing=" + setup["sharing"], "ipc.max_request=%d" % setup["max_request"],
                "staging.prefetch=manual"]
        if "cache_headroom" in setup:
            sets.append("ipc.cache_headroom=" + setup["cache_headroom"])
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


import errno as errno_mod  # noqa: E402
