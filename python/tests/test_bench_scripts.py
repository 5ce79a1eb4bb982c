"""The verdicts of the GPU scripts from made-up outputs: no GPU, no mount.
scripts/autoload-gpu.py (gdsfs bench autoload) from case timings;
scripts/step-verdict.py (each step of test-gpu.sh, the summary of
bench-gpu.sh) from test and bench output."""

import os
import subprocess
import sys
import tempfile
import textwrap
import types
import unittest

from _support import REPO, load_script


def autoload_script():
    return load_script("autoload-gpu.py")


CALLS = {"safetensors.torch.load_file": 8, "safetensors.safe_open": 8, "torch.load": 1}


def bench(cases, mismatches=(), served=None):
    b = autoload_script().Bench(types.SimpleNamespace(work="/nonexistent"))
    b.results = {"cases": {k: v if isinstance(v, dict) else {"seconds": v, "checksum": "same"} for k, v in cases.items()},
                 "checks": {"mismatches": list(mismatches), "compared": 40, "calls": dict(CALLS),
                            "served": dict(CALLS) if served is None else served},
                 "files": {"safetensors_bytes": 4 << 30, "hf_model_bytes": 2 << 30, "torch_save_bytes": 1 << 30}}
    b.verdicts()
    return b


COLD = {"load_file plain SOURCE cold": 2.6, "load_file plain mount cold": 2.7, "load_file run not staged cold": 2.5}


class AutoloadVerdicts(unittest.TestCase):
    def test_cases_left_out_are_not_measured(self):
        # A run with --cases naming the cold cases must not fail the
        # targets of the cases it left out.
        b = bench(COLD)
        t = b.results["verdicts"]["targets"]
        self.assertIsNone(t["load_file resident >= 20x"])
        self.assertIsNone(t["hf plain mount >= 0.95 SOURCE"])
        self.assertIsNone(t["hf identical checksums and logits"])
        self.assertTrue(t["load_file not staged (cold) not slower"])
        self.assertTrue(t["load_file plain mount cold >= 0.95 SOURCE"])
        self.assertEqual(b.status(), 0)
        self.assertIn("| target: load_file resident >= 20x | not measured (--cases) |", b.table())

    def test_a_measured_target_that_fails_fails_the_run(self):
        b = bench(dict(COLD, **{"load_file plain mount cold": 3.0}))  # 2.6 / 3.0 = 0.87
        t = b.results["verdicts"]["targets"]
        self.assertFalse(t["load_file plain mount cold >= 0.95 SOURCE"])
        self.assertEqual(b.status(), 1)
        self.assertIn("| target: load_file plain mount cold >= 0.95 SOURCE | FAIL |", b.table())

    def test_mismatches_and_checksums_fail(self):
        self.assertEqual(bench(COLD, mismatches=["x"]).status(), 1)
        b = bench(COLD)
        b.results["cases"]["load_file run not staged cold"]["checksum"] = "other"
        b.verdicts()
        self.assertFalse(b.results["verdicts"]["load_file identical checksums"])
        self.assertFalse(b.results["verdicts"]["targets"]["load_file and torch_load identical checksums"])
        self.assertEqual(b.status(), 1)

    def test_a_cold_case_that_could_not_drop_the_page_cache_fails(self):
        b = bench(dict(COLD, **{"load_file plain mount cold": {"skipped": "page cache could not be dropped"}}))
        t = b.results["verdicts"]["targets"]
        self.assertEqual(t["load_file plain mount cold >= 0.95 SOURCE"], "not checked: page cache could not be dropped")
        self.assertEqual(b.status(), 1)
        self.assertIn("| target: load_file plain mount cold >= 0.95 SOURCE | not checked: page cache could not be dropped |",
                      b.table())

    def test_checks_whose_calls_fell_back_fail(self):
        key = "no mismatches against the libraries, every checked call served"
        self.assertTrue(bench(COLD).results["verdicts"]["targets"][key])
        b = bench(COLD, served={})  # every call went to the library: it compared the library with itself
        self.assertFalse(b.results["verdicts"]["targets"][key])
        self.assertEqual(b.status(), 1)
        b = bench(COLD, served=dict(CALLS, **{"torch.load": 0}))
        self.assertEqual(b.status(), 1)
        b = bench(COLD)
        b.results["checks"] = {"error": "Traceback ...\nRuntimeError: CUDA"}
        b.verdicts()
        self.assertEqual(b.results["verdicts"]["targets"][key], "not checked: RuntimeError: CUDA")
        self.assertEqual(b.status(), 1)

    def test_evict_must_leave_the_file_unstaged(self):
        with tempfile.TemporaryDirectory() as d:
            os.makedirs(os.path.join(d, "mnt", ".gdsfs"))
            b = autoload_script().Bench(types.SimpleNamespace(work=d))
            b.mnt, b.src = os.path.join(d, "mnt"), os.path.join(d, "src")
            b.rels = lambda path: ["a.bin"]
            with open(os.path.join(b.mnt, ".gdsfs", "cache"), "w") as f:
                f.write("a.bin\t1\tresident\tposix\n")
            with self.assertRaises(SystemExit) as e:
                b.evict("a.bin")
            self.assertIn("still in .gdsfs/cache", str(e.exception))
            with open(os.path.join(b.mnt, ".gdsfs", "cache"), "w") as f:
                f.write("b.bin\t1\tresident\tposix\n")
            b.evict("a.bin")  # not listed: evicted
            os.remove(os.path.join(b.mnt, ".gdsfs", "evict"))
            os.mkdir(os.path.join(b.mnt, ".gdsfs", "evict"))  # the write fails (EISDIR), not with ENOENT
            with self.assertRaises(SystemExit) as e:
                b.evict("a.bin")
            self.assertIn("evict a.bin:", str(e.exception))

    def test_a_single_case_compares_no_checksums(self):
        b = bench({"load_file plain SOURCE cold": 2.6})
        self.assertNotIn("load_file identical checksums", b.results["verdicts"])
        self.assertIsNone(b.results["verdicts"]["targets"]["load_file and torch_load identical checksums"])


GO_PASS = """=== RUN   TestA
--- PASS: TestA (0.01s)
=== RUN   TestB
=== RUN   TestB/x
--- PASS: TestB (0.00s)
    --- PASS: TestB/x (0.00s)
PASS
"""

GO_SKIP = """=== RUN   TestReplicasTwoGPUs
    replicas_test.go:25: SKIPPED: needs 2 GPUs (GPU 1: no device)
--- SKIP: TestReplicasTwoGPUs (0.00s)
PASS
"""

GO_NONE = """testing: warning: no tests to run
PASS
"""

PY_OK = """test_a (test_x.T.test_a) ... ok
test_b (test_x.T.test_b)
Docstring line. ... ok
test_c (test_x.T.test_c) ... skipped 'no second GPU'

----------------------------------------------------------------------
Ran 3 tests in 0.010s

OK (skipped=1)
"""


def verdict(kind, text, rc=0, *args):
    with tempfile.NamedTemporaryFile("w", suffix=".out", delete=False) as f:
        f.write(text)
    try:
        p = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "step-verdict.py"), kind, f.name, str(rc)] + list(args),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
    finally:
        os.unlink(f.name)
    return p.returncode, p.stdout


def bench_verdict(log, *failed):
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(textwrap.dedent(log))
    try:
        p = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "step-verdict.py"), "bench", f.name] + list(failed),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
    finally:
        os.unlink(f.name)
    return p.returncode, p.stdout


class StepVerdicts(unittest.TestCase):
    def test_go_step_that_passed(self):
        rc, out = verdict("go", GO_PASS)
        self.assertEqual(rc, 0, out)
        self.assertIn("ran 2, passed 2, skipped 0", out)  # leaves: TestA, TestB/x

    def test_go_pattern_that_matched_nothing(self):
        rc, out = verdict("go", GO_NONE)
        self.assertEqual(rc, 1, out)
        self.assertIn("no test matched the pattern", out)

    def test_go_skip_not_named_by_the_step(self):
        rc, out = verdict("go", GO_SKIP)
        self.assertEqual(rc, 1, out)
        self.assertIn("skipped without a reason named by the step: TestReplicasTwoGPUs", out)

    def test_go_skip_named_by_the_step(self):
        # The whole step skipped, as it expects: SKIPPED (2), never PASSED.
        rc, out = verdict("go", GO_SKIP, 0, "--skip", "TestReplicasTwoGPUs=one GPU here")
        self.assertEqual(rc, 2, out)
        self.assertIn("expected skip: TestReplicasTwoGPUs: one GPU here", out)
        self.assertNotIn("PASSED", out)
        text = GO_PASS + GO_SKIP
        rc, out = verdict("go", text, 0, "--skip", "TestReplicasTwoGPUs=one GPU here")
        self.assertEqual(rc, 0, out)

    def test_go_whole_step_skipped_is_not_passed_by_a_parent(self):
        text = "=== RUN   TestP\n=== RUN   TestP/a\n--- PASS: TestP (0.00s)\n    --- SKIP: TestP/a (0.00s)\nPASS\n"
        self.assertEqual(verdict("go", text)[0], 1)
        self.assertEqual(verdict("go", text, 0, "--skip", "TestP=why")[0], 2)

    def test_go_failure_and_exit_status(self):
        self.assertEqual(verdict("go", GO_PASS.replace("--- PASS: TestA", "--- FAIL: TestA"), 1)[0], 1)
        self.assertEqual(verdict("go", GO_PASS, 2)[0], 1)

    def test_python_counts(self):
        rc, out = verdict("py", PY_OK)
        self.assertEqual(rc, 1, out)
        self.assertIn("ran 3, passed 2, skipped 1 (expected 0)", out)
        rc, out = verdict("py", PY_OK, 0, "--skip", "test_c=one GPU")
        self.assertEqual(rc, 0, out)
        rc, out = verdict("py", "\n----\nRan 0 tests in 0.000s\n\nOK\n")
        self.assertEqual(rc, 1, out)
        self.assertIn("no test ran", out)
        rc, out = verdict("py", PY_OK.replace("test_b)\nDocstring line. ... ok", "test_b)\nDocstring line. ... FAIL"), 1, "--skip", "test_c=x")
        self.assertEqual(rc, 1, out)
        self.assertIn("failed: test_x.T.test_b", out)

    def test_python_output_between_a_test_and_its_result(self):
        # A test's own logs go to stderr between "... " and its result word.
        text = ("test_a (test_x.T.test_a) ... gdsfs autoload: x served by the original function; logged once\n"
                "ok\n"
                "test_b (test_x.T.test_b) ... log line\nanother\nskipped 'needs two GPUs'\n"
                "test_c (test_x.T.test_c) ... a line ending in ok\nFAIL\n"
                "\n" + "=" * 70 + "\nFAIL: test_c (test_x.T.test_c)\n" + "-" * 70 + "\nRan 3 tests in 1s\n\nFAILED (failures=1, skipped=1)\n")
        rc, out = verdict("py", text, 1, "--skip", "test_b=one GPU")
        self.assertEqual(rc, 1, out)
        self.assertIn("ran 3, passed 1, skipped 1 (expected 1)", out)
        self.assertIn("failed: test_x.T.test_c", out)

    def test_script_checks(self):
        text = "PASS  a\nPASS  b\n"
        self.assertEqual(verdict("sh", text, 0, "--count", "^PASS  ", "--min", "2")[0], 0)
        self.assertEqual(verdict("sh", text, 0, "--count", "^PASS  ", "--min", "3")[0], 1)
        self.assertEqual(verdict("sh", text + "FAIL  c\n", 0, "--count", "^PASS  ", "--min", "2")[0], 1)
        self.assertEqual(verdict("sh", text, 1, "--count", "^PASS  ", "--min", "2")[0], 1)

    def test_bench_summary(self):
        ok = """\
            target  gdsfs defaults >= 0.9 x pinned host-to-device copy             PASS  50.00 >= 48.00 GB/s
            target  gdsfs defaults >= 1.1 x KvikIO best                            not measured here: no --kvikio reader given
            --- ok: stage (30 s)
            """
        self.assertEqual(bench_verdict(ok)[0], 0)
        for bad in ("target  every acquire succeeds (128 of 128)                         FAIL\n",
                    "target  Go repeat lease, 1GiB, median <= 0.3 ms                     MISS  0.500 >  0.300 ms\n",
                    "target  gdsfs defaults >= 1.3 x best Python peer                    not checked: no Python peer measured\n",
                    "| target: load_file resident >= 20x | FAIL |\n"):
            rc, out = bench_verdict(ok + bad)
            self.assertEqual(rc, 1, bad + out)
        self.assertEqual(bench_verdict(ok, "loader")[0], 1)
        self.assertEqual(bench_verdict("--- ok: stage\n")[0], 1)  # no target line at all


def readahead_run(cases, dry_run=False, cold_gbps=2.0, shards=4):
    m = load_script("readahead-gpu.py")
    a = types.SimpleNamespace(shards=shards, shard_mib=32, workers=4, device="auto", dry_run=dry_run, no_drop=dry_run,
                              io_threads=8)
    r = m.Run(a)
    full = {"off": (4.0, 0.5, 0.0), "on": (1.1, 0.5, 0.9), "replay": (1.1, 0.3, 1.0)}
    full.update(cases)
    for name, (epoch, first, hits) in full.items():
        if epoch is None:
            continue
        r.results["cases"][name] = {"epoch_s": epoch, "first_batch_s": first, "gbps": shards * (32 << 20) / epoch / 1e9,
                                    "hit_ratio": hits, "bad": [], "missing": [], "stats": {}, "workers": 1, "compute_s": 0.1,
                                    "sum_wait_s": 0}
    r.results["cold"] = {"gbps": cold_gbps, "seconds": 1, "bytes": 1}
    r.results["shard_read_s"] = 0.1
    with tempfile.NamedTemporaryFile("w", suffix=".trace", delete=False) as f:
        f.write("# trace\n" + "".join("shards/shard-%04d.bin\n" % i for i in range(shards)))
    r.trace = f.name
    try:
        r.verdicts()
    finally:
        os.unlink(f.name)
    return r, {t["goal"]: t["status"] for t in r.results["targets"]}


class ReadaheadVerdicts(unittest.TestCase):
    """scripts/readahead-gpu.py: the targets from made-up case timings."""

    COMPUTE = "1 worker computing a shard's read time: epoch on <= 0.65 x off"
    FIRST = "1 worker computing: first batch, read-ahead on <= off"
    ON = "4 workers, cold: epoch, read-ahead on >= 0.95 x disk cold rate"
    REPLAY = "4 workers, cold: epoch, trace replay >= 0.9 x disk cold rate"

    def test_every_target_met(self):
        # 4 x 32 MiB in 0.065 s is 2.06 GB/s against a cold rate of 2.0.
        r, t = readahead_run({"on": (0.065, 0.5, 0.9), "replay": (0.07, 0.3, 1.0),
                              "compute off": (2.0, 0.20, 0), "compute on": (1.2, 0.20, 0.9)})
        self.assertEqual(t, {self.COMPUTE: "PASS", self.FIRST: "PASS", self.ON: "PASS", self.REPLAY: "PASS"})
        self.assertEqual(r.status(), 0)
        self.assertIn("PASS  1.200 <= 1.300 s", r.table())

    def test_read_ahead_that_does_not_pay_misses(self):
        r, t = readahead_run({"on": (0.5, 0.5, 0.9), "compute off": (2.0, 0.20, 0), "compute on": (1.4, 0.25, 0.9)})
        self.assertEqual(t[self.COMPUTE], "MISS")
        self.assertEqual(t[self.FIRST], "MISS")
        self.assertEqual(t[self.ON], "MISS")
        self.assertEqual(r.status(), 1)
        self.assertIn("MISS  1.400 >  1.300 s", r.table())

    def test_a_case_that_did_not_run_is_not_checked(self):
        r, t = readahead_run({"on": (0.065, 0.5, 0.9), "replay": (0.07, 0.3, 1.0), "compute off": (2.0, 0.2, 0)})
        self.assertEqual(t[self.COMPUTE], "not checked: a case it needs did not run")
        self.assertEqual(t[self.ON], "PASS")
        self.assertEqual(r.status(), 1)

    def test_dry_run_targets_are_not_measured_here_but_bytes_are_checked(self):
        r, t = readahead_run({"compute off": (2.0, 0.2, 0), "compute on": (3.0, 0.5, 0.9)}, dry_run=True)
        for goal, status in t.items():
            self.assertTrue(status.startswith("not measured here: dry run"), goal + ": " + status)
        self.assertEqual(r.status(), 0)
        r.results["checks"]["on: every shard's bytes match"] = False
        self.assertEqual(r.status(), 1)


class BenchScriptSummary(unittest.TestCase):
    """scripts/bench-gpu.sh --verdict LOG [STEP...]: the summary the script ends with."""

    def run_summary(self, log, *failed):
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "bench-gpu.txt")
            with open(p, "w") as f:
                f.write(log)
            r = subprocess.run(["sh", os.path.join(REPO, "scripts", "bench-gpu.sh"), "--verdict", p] + list(failed),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
            return r.returncode, r.stdout

    def test_a_miss_fails_and_is_never_every_step_measured(self):
        rc, out = self.run_summary("target  x                  MISS  1 < 2 GB/s\n")
        self.assertEqual(rc, 1, out)
        self.assertNotIn("every step measured", out)

    def test_a_failed_step_fails(self):
        rc, out = self.run_summary("target  x                  PASS\n", "contention")
        self.assertEqual(rc, 1, out)
        self.assertIn("contention", out)

    def test_all_passed(self):
        rc, out = self.run_summary("target  x                  PASS\ntarget  y   not measured here: host backend (staging.device=host)\n")
        self.assertEqual(rc, 0, out)
        self.assertIn("BENCH DONE", out)


class WorkDirOfAnotherUser(unittest.TestCase):
    """autoload-gpu.py, frameworks-gpu.py and readahead-gpu.py refuse a
    --work another user owns or may write (root would write its daemon
    log through their links), and make a missing one 0700."""

    def test_refused_by_name(self):
        if os.geteuid() != 0:
            self.skipTest("SKIPPED: needs root (a directory of uid 65534)")
        for name in ("autoload-gpu.py", "frameworks-gpu.py", "readahead-gpu.py"):
            m = load_script(name)
            with tempfile.TemporaryDirectory() as d:
                os.chmod(d, 0o755)
                theirs, open_ = os.path.join(d, "theirs"), os.path.join(d, "open")
                os.mkdir(theirs)
                os.chown(theirs, 65534, 65534)
                os.mkdir(open_)
                os.chmod(open_, 0o777)
                for work, why in ((theirs, "owned by uid 65534"), (os.path.join(theirs, "w"), "owned by uid 65534"),
                                  (open_, "writable by group or other")):
                    with self.assertRaises(SystemExit, msg=name + " " + work) as e:
                        m.own_work_dir(work)
                    self.assertIn("--work " + work, str(e.exception))
                    self.assertIn(why, str(e.exception))
                fresh = os.path.join(d, "a", "b")
                self.assertEqual(m.own_work_dir(fresh), fresh)
                self.assertEqual(os.stat(fresh).st_mode & 0o777, 0o700, name)



class StartMount(unittest.TestCase):
    """scripts/gpuscript.py start_mount, with a stand-in for the gdsfs
    binary: the command it runs, and whether the mount serves."""

    def fake(self, d, body):
        p = os.path.join(d, "gdsfs")
        with open(p, "w") as f:
            f.write("#!/bin/sh\n" + body)
        os.chmod(p, 0o755)
        return p

    def test_serves(self):
        with tempfile.TemporaryDirectory() as d:
            args, mnt = os.path.join(d, "args"), os.path.join(d, "mnt")
            # The last argument is the mount point: .gdsfs/version there says it serves.
            b = self.fake(d, 'printf "%%s\\n" "$@" > %s\nfor m; do :; done\nmkdir -p "$m/.gdsfs" && : > "$m/.gdsfs/version"\n'
                             'exec sleep 60\n' % args)
            with open(os.path.join(d, "log"), "wb") as log:
                proc, up = load_script("gpuscript.py").start_mount(b, ["a=1", "b=2"], "/src", mnt, log)
            try:
                self.assertTrue(up)
                self.assertIsNone(proc.poll(), "the daemon stand-in should be running")
            finally:
                proc.terminate()
                proc.wait()
            with open(args) as f:
                self.assertEqual(f.read().split("\n")[:-1], ["mount", "--set", "a=1", "--set", "b=2", "/src", mnt])

    def test_exits_first(self):
        with tempfile.TemporaryDirectory() as d:
            b = self.fake(d, "echo no mount here; exit 3\n")
            with open(os.path.join(d, "log"), "wb") as log:
                proc, up = load_script("gpuscript.py").start_mount(b, [], "/src", os.path.join(d, "mnt"), log)
            self.assertFalse(up)
            self.assertEqual(proc.returncode, 3)
            with open(os.path.join(d, "log")) as f:
                self.assertEqual(f.read(), "no mount here\n")


if __name__ == "__main__":
    unittest.main()
