"""The examples run for real against a host-backend mount."""

import hashlib
import json
import os
import re
import struct
import subprocess
import sys
import unittest

import _support  # noqa: F401 (puts python/ on sys.path)
from _support import REPO, have_torch, loud, start_mount

EXAMPLES = os.path.join(REPO, "examples")


def run(args, timeout=300):
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    return subprocess.run([sys.executable] + args, cwd=REPO, env=env, timeout=timeout,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def safetensors_bytes():
    """A tiny safetensors file written by hand, and {name: its bytes}."""
    parts = [
        ("weight", "F32", [2, 3], struct.pack("<6f", 1.0, -2.5, 3.25, 0.0, 1e-3, 7.0)),
        ("index", "I64", [3], struct.pack("<3q", 1, -2, 1 << 40)),
        ("half", "F16", [2, 2], struct.pack("<4e", 0.5, 1.5, -2.0, 65504.0)),
        ("mask", "BOOL", [5], bytes([1, 0, 1, 1, 0])),
        ("odd", "F16", [3], struct.pack("<3e", 1.0, 2.0, 3.0)),  # at offset 53: unaligned
        ("scalar", "U8", [], b"\x2a"),
    ]
    header, data, blobs = {"__metadata__": {"format": "pt"}}, b"", {}
    for name, dtype, shape, b in parts:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(b)]}
        data += b
        blobs[name] = b
    h = json.dumps(header).encode()
    h += b" " * (-(8 + len(h)) % 8)
    return struct.pack("<Q", len(h)) + h + data, blobs


class ExampleTests(unittest.TestCase):
    def test_help(self):
        for ex in ("dataloader.py", "safetensors_load.py"):
            with self.subTest(example=ex):
                r = run([os.path.join(EXAMPLES, ex), "--help"])
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertIn(b"usage:", r.stdout)

    def test_safetensors_host(self):
        m = start_mount(self)
        raw, blobs = safetensors_bytes()
        p = m.write("model.safetensors", raw)
        modes = [["--no-torch"]]
        if have_torch():
            modes.append(["--verify"])
        else:
            loud("NOTE: torch not importable by %s: safetensors example runs its memoryview path only" % sys.executable)
        for extra in modes:
            with self.subTest(mode=extra):
                r = run([os.path.join(EXAMPLES, "safetensors_load.py"), p] + extra)
                out = r.stdout.decode()
                self.assertEqual(r.returncode, 0, out + r.stderr.decode())
                got = dict(re.findall(r"^(\w+)\t\w+\t\[[^\]]*\]\tsha256=([0-9a-f]{64})", out, re.M))
                self.assertEqual(got, {n: hashlib.sha256(b).hexdigest() for n, b in blobs.items()}, out)
                self.assertIn("6 tensors, %d bytes" % sum(len(b) for b in blobs.values()), out)
                if "--verify" in extra:
                    self.assertIn("verified", out)
                    self.assertRegex(out, r"odd\t.*copied")
                    self.assertRegex(out, r"weight\t.*cpu float32 zero-copy")
        self.assertEqual(m.wait_leases(0, 10), 0)

    def test_safetensors_bad_header(self):
        m = start_mount(self)
        p = m.write("bad.safetensors", struct.pack("<Q", 1 << 40) + b"{}")
        r = run([os.path.join(EXAMPLES, "safetensors_load.py"), p, "--no-torch"])
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn(b"header length", r.stderr)

    def test_dataloader_host(self):
        if not have_torch():
            self.skipTest(loud("SKIPPED: torch not importable by %s; dataloader example not run" % sys.executable))
        m = start_mount(self)
        r = run([os.path.join(EXAMPLES, "dataloader.py"), "--make-shards", os.path.join(m.src, "shards"),
                 "--shards", "4", "--records", "1024", "--dim", "8"])
        self.assertEqual(r.returncode, 0, r.stderr)
        for source in ("lease", "read"):
            with self.subTest(source=source):
                r = run([os.path.join(EXAMPLES, "dataloader.py"), m.path("shards"), "--source", source,
                         "--epochs", "3"])
                out = r.stdout.decode()
                self.assertEqual(r.returncode, 0, out + r.stderr.decode())
                self.assertIn("source=%s" % source, out)
                self.assertIn("final loss", out)
                self.assertIn("leases active on the mount after training: 0", out)


if __name__ == "__main__":
    unittest.main()
