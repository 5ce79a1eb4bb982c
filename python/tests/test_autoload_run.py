"""`gdsfs run`, GDSFS_AUTOLOAD=1 and the sitecustomize chain, in fresh
processes against a real host-backend mount: the autoloader is on in the
command, its child processes and its DataLoader workers (fork and spawn),
imports nothing early, keeps the sitecustomize it hides, and works from a
binary outside the repository. Needs torch: fails in CI without it."""

import json
import os
import shutil
import subprocess
import sys
import unittest

import _support
from _support import PYDIR, start_mount
import _autoload_support as S

CHILD = os.path.join(S.FIXTURES, "autoload_child.py")


def _env(**over):
    e = {k: v for k, v in os.environ.items() if not k.startswith(("GDSFS_", "PYTHONPATH"))}
    e["PYTHONDONTWRITEBYTECODE"] = "1"
    e.update(over)
    return e


class TestRun(unittest.TestCase):
    def setUp(self):
        S.require_torch(self)
        self.bin, why = _support.gdsfs_bin()
        if why:
            self.skipTest(_support.loud("SKIPPED: " + why))

    def run_py(self, argv, env, wrapper=True, check=True):
        cmd = ([self.bin, "run", "--"] if wrapper else []) + [sys.executable] + argv
        r = subprocess.run(cmd, env=env, cwd="/", stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=300)
        if check and r.returncode != 0:
            self.fail("%s exited %d:\n%s" % (cmd, r.returncode, r.stderr.decode(errors="replace")[-4000:]))
        return r

    def checkpoint(self, m):
        import torch

        torch.save({"x": torch.arange(10)}, os.path.join(m.src, "c.pt"))

    def test_children_and_dataloader_workers_are_patched(self):
        m = start_mount(self, device="host")
        self.checkpoint(m)
        out = json.loads(self.run_py([CHILD, m.mnt, "parent"], _env()).stdout)
        for who in ("parent", "child", "worker_fork", "worker_spawn"):
            got = out if who == "parent" else out[who]
            self.assertEqual((got["patched"], got["served"], got["equal"]), (True, 1, True), (who, out))
        pids = {out["pid"], out["child"]["pid"], out["worker_fork"]["pid"], out["worker_spawn"]["pid"]}
        self.assertEqual(len(pids), 4, out)
        self.assertEqual(m.wait_leases(0), 0)

    def test_without_run_nothing_is_patched(self):
        m = start_mount(self, device="host")
        self.checkpoint(m)
        out = json.loads(self.run_py([CHILD, m.mnt, "child"], _env(), wrapper=False).stdout)
        self.assertEqual((out["patched"], out["served"], out["equal"]), (False, 0, True), out)

    def test_env_switch_with_python_dir_on_path(self):
        m = start_mount(self, device="host")
        self.checkpoint(m)
        on = json.loads(self.run_py([CHILD, m.mnt, "child"], _env(PYTHONPATH=PYDIR, GDSFS_AUTOLOAD="1"),
                                    wrapper=False).stdout)
        self.assertEqual((on["patched"], on["served"]), (True, 1), on)
        off = json.loads(self.run_py([CHILD, m.mnt, "child"], _env(PYTHONPATH=PYDIR), wrapper=False).stdout)
        self.assertEqual((off["patched"], off["served"]), (False, 0), off)

    def test_nothing_imported_early(self):
        r = self.run_py(["-c", "import sys; print(sorted(m for m in ('torch', 'safetensors', 'gdsfs', 'numpy') "
                               "if m in sys.modules))"], _env())
        self.assertEqual(r.stdout.decode().strip(), "[]")

    def test_existing_sitecustomize_still_runs(self):
        d = _support.tmpdir("gdsfs-sc-")
        with open(os.path.join(d, "sitecustomize.py"), "w") as f:
            f.write("import os\nos.environ['GDSFS_TEST_CHAINED'] = 'yes'\n")
        r = self.run_py(["-c", "import os, torch; print(os.environ.get('GDSFS_TEST_CHAINED'), "
                               "hasattr(torch.load, '_gdsfs_original'))"], _env(PYTHONPATH=d))
        self.assertEqual(r.stdout.decode().split(), ["yes", "True"])

    def test_safetensors_patched_on_import(self):
        m = start_mount(self, device="host")
        shutil.copyfile(os.path.join(S.ST_FIXTURES, "nometa.safetensors"), os.path.join(m.src, "n.safetensors"))
        code = ("import sys, safetensors.torch as st; d = st.load_file(sys.argv[1]); "
                "import gdsfs.autoload as A; print(sorted(d), A.served())")
        _, real = S.safetensors_lib()
        pp = None if real else S.FAKE_ST
        env = _env(PYTHONPATH=pp) if pp else _env()
        r = self.run_py(["-c", code, m.path("n.safetensors")], env)
        self.assertEqual(r.stdout.decode().strip(), "['a', 'b'] {'safetensors.torch.load_file': 1}")

    def installed(self):
        """(a copy of the binary outside the repository, a HOME for it)."""
        d = _support.tmpdir("gdsfs-inst-")
        os.makedirs(os.path.join(d, "bin"))
        b = os.path.join(d, "bin", "gdsfs")
        shutil.copy(self.bin, b)
        home = os.path.join(d, "home")
        os.makedirs(home)
        return b, home

    def test_binary_outside_the_repository(self):
        b, home = self.installed()
        env = _env(HOME=home)
        env.pop("XDG_CACHE_HOME", None)
        r = subprocess.run([b, "run", "--zero-copy", sys.executable, "-c",
                            "import os, torch, gdsfs; print(gdsfs.__file__); "
                            "print(hasattr(torch.load, '_gdsfs_original'), os.environ['GDSFS_ZERO_COPY'])"],
                           env=env, cwd="/", stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=300)
        self.assertEqual(r.returncode, 0, r.stderr.decode(errors="replace"))
        where, flags = r.stdout.decode().splitlines()
        self.assertTrue(where.startswith(os.path.join(home, ".cache", "gdsfs", "python-")), where)
        self.assertEqual(flags, "True 1")

    def test_python_dir_also_on_pythonpath(self):
        # python/ on PYTHONPATH as well as the binary's own copy: one
        # bootstrap runs, and the sitecustomize both hide runs once.
        b, home = self.installed()
        sc = _support.tmpdir("gdsfs-sc-")
        with open(os.path.join(sc, "sitecustomize.py"), "w") as f:
            f.write("import os\nos.environ['GDSFS_TEST_CHAINED'] = os.environ.get('GDSFS_TEST_CHAINED', '') + 'x'\n")
        env = _env(HOME=home, PYTHONPATH=os.pathsep.join([PYDIR, sc]))
        env.pop("XDG_CACHE_HOME", None)
        r = subprocess.run([b, "run", sys.executable, "-c",
                            "import os, torch, gdsfs; print(os.environ.get('GDSFS_TEST_CHAINED'), "
                            "hasattr(torch.load, '_gdsfs_original'), gdsfs.__file__.startswith(%r))" % home],
                           env=env, cwd="/", stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=300)
        self.assertEqual((r.returncode, r.stderr.decode(errors="replace")), (0, ""))
        self.assertEqual(r.stdout.decode().split(), ["x", "True", "True"])

    def test_run_needs_a_command(self):
        r = subprocess.run([self.bin, "run"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
        self.assertEqual(r.returncode, 2)
        self.assertIn(b"COMMAND", r.stderr)


if __name__ == "__main__":
    unittest.main()
