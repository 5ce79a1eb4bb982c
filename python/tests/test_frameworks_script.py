"""The verdicts of scripts/frameworks-gpu.py from made-up case results (no
GPU, no mount), and its overhead mode on this machine."""

import json
import os
import subprocess
import sys
import types
import unittest

from _support import REPO, load_script
import _autoload_support as S

SCRIPT = os.path.join(REPO, "scripts", "frameworks-gpu.py")


def script():
    return load_script("frameworks-gpu.py")


def case(seconds, checksum="c", served=None, **kw):
    r = {"seconds": seconds, "checksum": checksum, "served": {"torch.Tensor.to": 5} if served is None else served}
    r.update(kw)
    return r


def bench(cases):
    b = script().Bench(types.SimpleNamespace(work="/nonexistent"))
    b.results = {"cases": cases, "files": {"hf_model_bytes": 2 << 30, "shard_bytes": 2 << 30}}
    b.verdicts()
    b.table()
    return b.results


GOOD = {
    "hf plain mount warm": case(0.8, logits="l", moves_seconds=0.3, profiled_seconds=0.85),
    "hf run resident": case(0.4, logits="l", moves_seconds=0.02, profiled_seconds=0.45),
    "hf run not staged warm": case(0.7, logits="l"),
    "vllm plain mount warm": case(0.3), "vllm run resident": case(0.02),
    "dataloader plain mount warm": case(0.3), "dataloader run resident": case(0.02),
}


class Verdicts(unittest.TestCase):
    def test_targets_met(self):
        r = bench(GOOD)
        self.assertEqual(r["failures"], [])
        self.assertTrue(all(r["targets"].values()), r["targets"])
        self.assertEqual(r["verdicts"]["hf moves speed-up"], 15.0)

    def test_checksum_or_logits_mismatch_fails(self):
        for key, field in (("vllm run resident", "checksum"), ("hf run resident", "logits"),
                           ("hf run not staged warm", "checksum")):
            with self.subTest(key=key):
                c = dict(GOOD)
                c[key] = dict(c[key], **{field: "other"})
                self.assertEqual(len(bench(c)["failures"]), 1)

    def test_nothing_served_fails(self):
        c = dict(GOOD)
        c["dataloader run resident"] = case(0.3, served={})
        f = bench(c)["failures"]
        self.assertEqual(len(f), 1)
        self.assertIn("nothing served", f[0])

    def test_slow_resident_fails_its_target(self):
        c = dict(GOOD)
        c["vllm run resident"] = case(0.1)
        self.assertFalse(bench(c)["targets"]["vllm resident >= 10x plain"])


class Overhead(unittest.TestCase):
    def test_moves_on_several_threads_count_once(self):
        """The profiled time in moves is the union of their intervals:
        moves made at once on several threads count once, gaps not at all."""
        busy = script().busy
        self.assertEqual(busy([]), 0.0)
        self.assertAlmostEqual(busy([(0.0, 1.0), (0.5, 1.5), (0.6, 0.7), (2.0, 2.5)]), 2.0)
        self.assertAlmostEqual(busy([(3.0, 4.0), (0.0, 1.0)]), 2.0)

    def test_overhead_mode_never_rebuilds_the_index(self):
        S.require_torch(self)
        r = subprocess.run([sys.executable, SCRIPT, "overhead", "--calls", "200"], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=300)
        out = json.loads(r.stdout.decode())
        self.assertEqual(out["index_rebuilds"], 0, out)
        self.assertEqual(set(out["ns_per_call"]), {"plain", "wrapped, index empty", "wrapped, index not empty"})


if __name__ == "__main__":
    unittest.main()
