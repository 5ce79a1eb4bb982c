"""The Python client as an installed package: its version (one source
with the binary's), its check against a daemon's hello, its modules'
imports, and the wheel `make wheel` builds, installed into a fresh venv."""

import ast
import glob
import os
import shutil
import subprocess
import sys
import unittest
import warnings

import _support
import test_unit as _tu

import gdsfs
from gdsfs import _version

PKG = os.path.join(_support.PYDIR, "gdsfs")


def _release():
    with open(os.path.join(PKG, "VERSION")) as f:
        return f.read().strip()


class VersionTests(unittest.TestCase):
    def test_version_is_the_version_file(self):
        self.assertEqual(gdsfs.__version__, _release())

    def test_binary_reports_the_same_release(self):
        path, why = _support.gdsfs_bin()
        if why:
            self.skipTest(_support.loud("SKIPPED: no gdsfs binary to compare with: %s" % why))
        out = subprocess.run([path, "version"], capture_output=True, text=True, check=True).stdout
        first = out.splitlines()[0]  # "gdsfs 0.2.0" or "gdsfs 0.2.0+BUILD"
        self.assertRegex(first, r"^gdsfs %s(\+\S+)?$" % _release().replace(".", r"\."), out)


    def test_run_uses_the_binarys_embedded_copy(self):
        """gdsfs run, with no python/ beside the binary, loads the copy
        built into it, whose release is the binary's."""
        path, why = _support.gdsfs_bin()
        if why:
            self.skipTest(_support.loud("SKIPPED: no gdsfs binary: %s" % why))
        d = _support.tmpdir("gdsfs-embedded-")
        os.mkdir(os.path.join(d, "bin"))
        binary = os.path.join(d, "bin", "gdsfs")
        shutil.copy(path, binary)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("GDSFS_", "PYTHONPATH"))}
        env["XDG_CACHE_HOME"] = os.path.join(d, "cache")
        r = subprocess.run([binary, "run", "--", sys.executable, "-c", "import gdsfs; print(gdsfs.__version__, gdsfs.__file__)"],
                           capture_output=True, text=True, env=env, cwd=d)
        self.assertEqual(r.returncode, 0, r.stderr)
        version, where = r.stdout.split()
        self.assertEqual(version, _release())
        self.assertTrue(where.startswith(env["XDG_CACHE_HOME"] + os.sep), "gdsfs run loaded %s, not its own copy" % where)


class CheckDaemonTests(unittest.TestCase):
    """check_daemon against a daemon that answers hello as told."""

    def setUp(self):
        _tu.fake_root_mount(self)
        with _version._lock:
            saved = set(_version._warned)
            _version._warned.clear()
        self.addCleanup(lambda: (_version._warned.clear(), _version._warned.update(saved)))

    def hello(self, answer_for, conns=1):
        """A fake daemon answering each hello with answer_for(request)."""
        f = _tu.FakeDaemon(lambda req: [("send", _tu.answer(answer_for(req)), None)], conns=conns)
        self.addCleanup(f.close)
        return f

    def check(self, f):
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            resp = gdsfs.check_daemon("/x", socket=f.path)
        return resp, [w for w in got if issubclass(w.category, gdsfs.VersionWarning)]

    def test_same_release_is_silent(self):
        f = self.hello(lambda req: {"ok": True, "epoch": 7, "version": 1, "release": gdsfs.__version__ + "+abc123"})
        resp, warned = self.check(f)
        self.assertEqual(warned, [])
        self.assertEqual(f.requests, [{"op": "hello", "version": 1, "release": gdsfs.__version__}])
        self.assertEqual(resp["version"], 1)

    def test_other_release_warns_once(self):
        f = self.hello(lambda req: {"ok": True, "epoch": 7, "version": 1, "release": "9.9.9"}, conns=2)
        _, warned = self.check(f)
        self.assertEqual(len(warned), 1)
        msg = str(warned[0].message)
        self.assertIn("is gdsfs 9.9.9", msg)
        self.assertIn("this Python package is %s" % gdsfs.__version__, msg)
        _, warned = self.check(f)
        self.assertEqual(warned, [], "a second check of the same daemon warned again")
        self.assertEqual(len(f.requests), 2)

    def test_daemon_that_refuses_release_warns(self):
        def answer(req):
            if "release" in req:
                return {"ok": False, "epoch": 7, "errno": "EINVAL", "error": "hello: unknown field release"}
            return {"ok": True, "epoch": 7, "version": 1}

        f = self.hello(answer)
        resp, warned = self.check(f)
        self.assertEqual([r.get("release") for r in f.requests], [gdsfs.__version__, None])
        self.assertEqual(len(warned), 1)
        self.assertIn("does not say its release", str(warned[0].message))
        self.assertEqual(resp["version"], 1)

    def test_older_protocol_is_refused(self):
        f = self.hello(lambda req: {"ok": True, "epoch": 7, "release": gdsfs.__version__})
        with self.assertRaisesRegex(gdsfs.VersionMismatchError, "protocol version 0; .* needs 1"):
            gdsfs.check_daemon("/x", socket=f.path)

    def test_answers_of_another_type_are_protocol_errors(self):
        """A version or release that is not what hello answers (a number,
        a string) is the daemon's protocol error (EPROTO), named."""
        import errno

        for field, value in (("release", 123), ("release", ["0.2.0"]), ("version", "1")):
            with self.subTest(field=field, value=value):
                answer = {"ok": True, "epoch": 7, "version": 1, "release": gdsfs.__version__}
                answer[field] = value
                f = self.hello(lambda req, answer=answer: answer)
                with self.assertRaises(OSError) as cm:
                    self.check(f)
                self.assertEqual(cm.exception.errno, errno.EPROTO, cm.exception)
                self.assertIn(field, str(cm.exception))

    def test_release_is_shown_without_control_characters(self):
        """The daemon's release reaches the user's terminal in the warning:
        escape sequences and line breaks in it are not passed through."""
        f = self.hello(lambda req: {"ok": True, "epoch": 7, "version": 1, "release": "9.9\x1b]0;owned\x07\nFAKE LINE"})
        _, warned = self.check(f)
        self.assertEqual(len(warned), 1)
        msg = str(warned[0].message)
        self.assertNotIn("\x1b", msg)
        self.assertNotIn("\n", msg)

    def test_real_daemon_matches(self):
        m = _support.start_mount(self)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            resp = gdsfs.check_daemon(m.mnt, socket=m.sock)
        self.assertTrue(resp["release"].startswith(gdsfs.__version__), resp)


def _imports(path, pkg):
    """The package modules path imports at module level (not inside a
    function: those run later and cannot form a cycle at import)."""
    tree = ast.parse(open(path).read(), path)
    out = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level:
            base = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
            mod = ".".join(base + ([node.module] if node.module else []))
            out.add(mod)
            out.update(mod + "." + a.name for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("gdsfs"))
    return out


class ImportTests(unittest.TestCase):
    def test_no_import_cycle(self):
        """No two modules of the package import each other, directly or
        through others, at module level (a package importing its own
        modules is not a cycle)."""
        graph = {}
        for path in glob.glob(os.path.join(PKG, "**", "*.py"), recursive=True):
            rel = os.path.relpath(path, _support.PYDIR)[: -len(".py")].replace(os.sep, ".")
            name = rel[: -len(".__init__")] if rel.endswith(".__init__") else rel
            pkg = name if rel.endswith(".__init__") else name.rsplit(".", 1)[0]
            graph[name] = _imports(path, pkg)
        for name in graph:
            graph[name] = {m for m in graph[name] if m in graph and m != name and not name.startswith(m + ".")}

        def cycle(start):
            stack, seen = [(start, [start])], set()
            while stack:
                node, trail = stack.pop()
                for nxt in graph[node]:
                    if nxt == start:
                        return trail + [start]
                    if nxt not in seen:
                        seen.add(nxt)
                        stack.append((nxt, trail + [nxt]))
            return None

        self.assertIn("gdsfs._lease", graph)
        for name in sorted(graph):
            c = cycle(name)
            self.assertIsNone(c, "import cycle: %s" % " -> ".join(c or []))


class WheelTests(unittest.TestCase):
    """make wheel, then the wheel in a fresh venv, used from outside the
    source tree."""

    @classmethod
    def setUpClass(cls):
        cls.dir = _support.tmpdir("gdsfs-wheel-")
        wheels = os.path.join(cls.dir, "wheel")
        r = subprocess.run(["make", "-s", "-C", _support.REPO, "wheel", "WHEELDIR=" + wheels, "PYTHON=" + sys.executable],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise AssertionError("make wheel failed:\n%s%s" % (r.stdout, r.stderr))
        found = glob.glob(os.path.join(wheels, "gdsfs-*.whl"))
        if len(found) != 1:
            raise AssertionError("make wheel left %s" % found)
        cls.wheel = found[0]
        venv = os.path.join(cls.dir, "venv")
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", venv], check=True)
        cls.python = os.path.join(venv, "bin", "python")
        r = subprocess.run([cls.python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", cls.wheel],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise AssertionError("pip install of %s failed:\n%s%s" % (cls.wheel, r.stdout, r.stderr))
        cls.venv = venv

    def run_venv(self, code, *args):
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "GDSFS_AUTOLOAD")}
        r = subprocess.run([self.python, "-c", code] + list(args), capture_output=True, text=True, cwd=self.dir, env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        return r.stdout

    def test_wheel_is_named_by_the_release(self):
        self.assertEqual(os.path.basename(self.wheel), "gdsfs-%s-py3-none-any.whl" % _release())

    def test_installed_package_imports_and_reports_its_version(self):
        out = self.run_venv("import gdsfs, gdsfs.autoload, gdsfs.torch as _; print(gdsfs.__version__); print(gdsfs.__file__)")
        version, where = out.split()
        self.assertEqual(version, _release())
        self.assertTrue(where.startswith(self.venv + os.sep), "gdsfs imported from %s, not the venv" % where)

    def test_installed_autoload_hooks_imports_once(self):
        """Without gdsfs's sitecustomize, import gdsfs.autoload puts the
        bootstrap's one finder on sys.meta_path and patches torch when the
        program imports it."""
        if not _support.have_torch():
            self.skipTest(_support.loud("SKIPPED: torch not importable: the autoloader's patch cannot be seen"))
        code = (
            "import sys, gdsfs.autoload\n"
            "import torch\n"
            "n = sum(type(f).__name__ == 'Finder' and type(f).__module__.endswith('boot') for f in sys.meta_path)\n"
            "print(sys.modules['_gdsfs_boot'].__file__, hasattr(torch.load, '_gdsfs_original'), n)\n"
        )
        where, patched, finders = self.run_venv(code).split()
        self.assertTrue(where.startswith(self.venv + os.sep), where)
        self.assertEqual((patched, finders), ("True", "1"), "torch.load patched by one finder (still waiting for safetensors)")

    def test_installed_package_leases_from_a_daemon(self):
        m = _support.start_mount(self)
        data = os.urandom(10000)
        path = m.write("a.bin", data)
        code = (
            "import sys, warnings, gdsfs\n"
            "warnings.simplefilter('error')\n"
            "gdsfs.check_daemon(sys.argv[1], socket=sys.argv[2])\n"
            "with gdsfs.open(sys.argv[1], socket=sys.argv[2]) as l:\n"
            "    sys.stdout.write(l.read(0, l.size).hex())\n"
        )
        self.assertEqual(bytes.fromhex(self.run_venv(code, path, m.sock)), data)


if __name__ == "__main__":
    unittest.main()
