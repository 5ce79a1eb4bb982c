"""The verdicts of scripts/autoload-gpu.py (gdsfs bench autoload), from
made-up case timings: no GPU, no mount."""

import importlib.util
import os
import types
import unittest

from _support import REPO


def autoload_script():
    spec = importlib.util.spec_from_file_location("autoload_gpu", os.path.join(REPO, "scripts", "autoload-gpu.py"))
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def bench(cases, mismatches=()):
    b = autoload_script().Bench(types.SimpleNamespace(work="/nonexistent"))
    b.results = {"cases": {k: {"seconds": v, "checksum": "same"} for k, v in cases.items()},
                 "checks": {"mismatches": list(mismatches)},
                 "files": {"safetensors_bytes": 4 << 30, "hf_model_bytes": 2 << 30, "torch_save_bytes": 1 << 30}}
    b.verdicts()
    return b


COLD = {"load_file plain SOURCE cold": 2.6, "load_file plain mount cold": 2.7, "load_file run not staged cold": 2.5}


class AutoloadVerdicts(unittest.TestCase):
    def test_cases_left_out_are_not_measured(self):
        # Found on the H200: a run with --cases naming the cold cases
        # failed every target of the cases it left out, and exited 1.
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

    def test_a_single_case_compares_no_checksums(self):
        b = bench({"load_file plain SOURCE cold": 2.6})
        self.assertNotIn("load_file identical checksums", b.results["verdicts"])
        self.assertIsNone(b.results["verdicts"]["targets"]["load_file and torch_load identical checksums"])


if __name__ == "__main__":
    unittest.main()
