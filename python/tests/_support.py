"""Test helpers: the gdsfs binary, real mounts, child processes.

Mounting tests need root and /dev/fuse; they skip loudly otherwise. The
daemon binary is $GDSFS_BIN, else built once per run with
`go build -o <tmp>/gdsfs ./cmd/gdsfs` from the repository root.
"""

import atexit
import importlib.util
import json
import os
import select
import shutil
import signal
import socket
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


def load_script(name):
    """Imports scripts/NAME (autoload-gpu.py, ...) as a module. scripts/ goes
    on sys.path, as it is first there when the script runs: the scripts
    import the modules beside them."""
    scripts = os.path.join(REPO, "scripts")
    if scripts not in sys.path:
        sys.path.append(scripts)
    spec = importlib.util.spec_from_file_location(name[:-len(".py")].replace("-", "_"), os.path.join(scripts, name))
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


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
        # The daemon says READY=1 on $NOTIFY_SOCKET once it serves, as it
        # tells systemd: wait for that, or for its exit.
        notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            notify.bind(os.path.join(self.dir, "notify"))
            env = dict(os.environ, NOTIFY_SOCKET=os.path.join(self.dir, "notify"))
            self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
            self._wait_ready(notify, 30)
        finally:
            notify.close()

    def _wait_ready(self, notify, timeout):
        pidfd = os.pidfd_open(self.proc.pid)  # readable once the daemon exits
        try:
            deadline = time.monotonic() + timeout
            while True:
                left = deadline - time.monotonic()
                ready = select.select([notify, pidfd], [], [], max(left, 0))[0]
                if pidfd in ready:
                    self.proc.wait()
                    self._log.close()
                    raise AssertionError("gdsfs exited (%s) before mounting:\n%s" % (self.proc.returncode, self.log()))
                if not ready:
                    self.stop()
                    raise AssertionError("gdsfs did not say READY=1 in %ds:\n%s" % (timeout, self.log()))
                fields = notify.recv(4096).decode(errors="replace").split("\n")
                if "READY=1" in fields:
                    if "MAINPID=%d" % self.proc.pid not in fields:
                        self.stop()
                        raise AssertionError("READY=1 not from the daemon (pid %d): %r" % (self.proc.pid, fields))
                    return
        finally:
            os.close(pidfd)

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
        """Wait until the daemon's lease counter key (leases_active,
        lease_held_bytes, ipc_open_connections, ...) is want, through the
        daemon's wait_stat request (gdsfs.wait_stat: it answers when the
        counter changes; the daemon ends connections asynchronously).
        Return want, or the value in stats.json when it did not come."""
        import gdsfs

        try:
            gdsfs.wait_stat(self.mnt, key, want, timeout=timeout, socket=self.sock)
            return want
        except TimeoutError:
            return self.stats()[key]


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
