"""The bootstrap and gdsfs.autoload's enable/disable, in fresh interpreters
without a mount: one bootstrap and one import hook per process whatever
copies of gdsfs are on sys.path and in what order, the sitecustomize it
hides runs once, and disable() puts back every function it patched.
Needs torch: fails in CI without it."""

import json
import os
import shutil
import subprocess
import sys
import unittest

import _support
from _support import PYDIR
import _autoload_support as S

# Prints what the bootstrap left: the finders of _gdsfs_boot (loaded by
# the sitecustomize, or imported as gdsfs._bootstrap.boot) on
# sys.meta_path, how often the hidden sitecustomize ran, and whether
# torch.load is patched once torch is imported.
PROBE = """
import json, os, sys
finders = [f for f in sys.meta_path if type(f).__module__ in ("_gdsfs_boot", "gdsfs._bootstrap.boot")]
import torch
print(json.dumps({"finders": len(finders), "chained": os.environ.get("GDSFS_TEST_CHAINED", ""),
                  "patched": hasattr(torch.load, "_gdsfs_original"),
                  "gdsfs": sys.modules["gdsfs"].__file__ if "gdsfs" in sys.modules else None}))
"""


def env(**over):
    e = {k: v for k, v in os.environ.items() if not k.startswith(("GDSFS_", "PYTHONPATH"))}
    e["PYTHONDONTWRITEBYTECODE"] = "1"
    e.update(over)
    return e


def copy_package(dst):
    """A second copy of python/'s bootstrap and package in dst."""
    os.makedirs(dst)
    shutil.copy(os.path.join(PYDIR, "sitecustomize.py"), dst)
    shutil.copytree(os.path.join(PYDIR, "gdsfs"), os.path.join(dst, "gdsfs"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    return dst


def user_sitecustomize(d):
    """A sitecustomize of the user's in d that counts its runs."""
    with open(os.path.join(d, "sitecustomize.py"), "w") as f:
        f.write("import os\nos.environ['GDSFS_TEST_CHAINED'] = os.environ.get('GDSFS_TEST_CHAINED', '') + 'x'\n")
    return d


def run_py(tc, code, e):
    r = subprocess.run([sys.executable, "-c", code], env=e, cwd="/", stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=300)
    err = r.stderr.decode(errors="replace")
    tc.assertEqual(r.returncode, 0, err[-4000:])
    tc.assertEqual(err, "", "the bootstrap wrote to stderr")
    return json.loads(r.stdout)


class TestOneBootstrap(unittest.TestCase):
    def setUp(self):
        S.require_torch(self)
        d = _support.tmpdir("gdsfs-boot-")
        self.copy = copy_package(os.path.join(d, "copy"))
        self.user = user_sitecustomize(_support.tmpdir("gdsfs-sc-"))

    def test_two_copies_on_the_path(self):
        for first, second in ((PYDIR, self.copy), (self.copy, PYDIR)):
            with self.subTest(first=first):
                pp = os.pathsep.join([first, second, self.user])
                out = run_py(self, PROBE, env(PYTHONPATH=pp, GDSFS_AUTOLOAD="1"))
                self.assertEqual(out["finders"], 1, out)
                self.assertEqual(out["chained"], "x", out)
                self.assertTrue(out["patched"], out)
                self.assertEqual(out["gdsfs"], os.path.join(first, "gdsfs", "__init__.py"))

    def test_off_still_chains(self):
        pp = os.pathsep.join([PYDIR, self.copy, self.user])
        out = run_py(self, PROBE, env(PYTHONPATH=pp))
        self.assertEqual((out["finders"], out["chained"], out["patched"], out["gdsfs"]), (0, "x", False, None), out)

    def test_gdsfs_comes_from_the_bootstrap_directory(self):
        # A gdsfs package earlier on sys.path (the script's directory, say)
        # is not what the bootstrap imports.
        other = _support.tmpdir("gdsfs-other-")
        os.makedirs(os.path.join(other, "gdsfs"))
        marker = os.path.join(other, "imported")
        with open(os.path.join(other, "gdsfs", "__init__.py"), "w") as f:
            f.write("open(%r, 'w').close()\n" % marker)
        code = "import sys; sys.path.insert(0, %r)\n" % other + PROBE
        out = run_py(self, code, env(PYTHONPATH=PYDIR, GDSFS_AUTOLOAD="1"))
        self.assertEqual(out["gdsfs"], os.path.join(PYDIR, "gdsfs", "__init__.py"))
        self.assertFalse(os.path.exists(marker))


# Patches, disables, enables and disables again, with safetensors and
# torch imported before or after gdsfs.autoload (or through the
# bootstrap); prints after each step which functions are patched and
# whether each is the original.
CYCLE = """
import json, sys
order = sys.argv[1]
if order == "autoload-first":
    import gdsfs.autoload as A
import safetensors, safetensors.torch, torch
if order != "autoload-first":
    import gdsfs.autoload as A
spots = [(safetensors, "safe_open"), (safetensors.torch, "safe_open"), (safetensors.torch, "load_file"),
         (torch, "load"), (torch.serialization, "load")]
orig = {}
for obj, attr in spots:
    orig[(obj.__name__, attr)] = getattr(getattr(obj, attr), "_gdsfs_original", None)
def state():
    out = {}
    for obj, attr in spots:
        f = getattr(obj, attr)
        key = obj.__name__ + "." + attr
        out[key] = "patched" if hasattr(f, "_gdsfs_original") else (
            "original" if f is orig[(obj.__name__, attr)] else "other")
    return out
steps = [("start", state())]
A.disable(); steps.append(("disabled", state()))
A.enable(); steps.append(("enabled", state()))
A.disable(); steps.append(("disabled again", state()))
print(json.dumps(steps))
"""


class TestDisable(unittest.TestCase):
    def setUp(self):
        S.require_torch(self)
        _, real = S.safetensors_lib()
        self.pp = [PYDIR] + ([] if real else [S.FAKE_ST])

    def test_disable_restores_every_patched_function(self):
        cases = {"autoload-first": {}, "autoload-last": {},
                 "bootstrap": {"GDSFS_AUTOLOAD": "1"}}
        for order, extra in cases.items():
            with self.subTest(order=order):
                e = env(PYTHONPATH=os.pathsep.join(self.pp), **extra)
                r = subprocess.run([sys.executable, "-c", CYCLE, order], env=e, cwd="/", stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, timeout=300)
                self.assertEqual(r.returncode, 0, r.stderr.decode(errors="replace")[-4000:])
                for step, st in json.loads(r.stdout):
                    want = "patched" if step in ("start", "enabled") else "original"
                    self.assertEqual(st, {k: want for k in st}, step)


if __name__ == "__main__":
    unittest.main()
