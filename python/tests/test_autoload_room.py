"""An autoloaded load that finds the daemon's capacity held by another
lease falls back at once (refused:ENOSPC, counted) instead of waiting out
ipc.acquire_timeout for room, on a real host-backend mount. Needs torch:
fails in CI without it."""

import json
import os
import subprocess
import unittest

import _autoload_support as S
from _support import child, start_mount

# Runs torch.load of argv[1] with the autoloader on; prints the fallbacks
# and served counts, and whether the result equals argv[2]'s (the SOURCE
# file) loaded plainly.
LOAD = r"""
import json, sys
import gdsfs.autoload as A
A.enable()
import torch
got = torch.load(sys.argv[1])
want = torch.load._gdsfs_original(sys.argv[2])
print(json.dumps({"fallbacks": A.fallbacks(), "served": A.served(), "same": bool(torch.equal(got["x"], want["x"]))}))
"""

# Far past the autoloader's room wait, far short of the daemon's
# ipc.acquire_timeout: only a load that waited for room reaches it.
BOUND = 60


class TestAutoloadNoRoom(unittest.TestCase):
    def setUp(self):
        S.require_torch(self)
        self.m = start_mount(self, chunk_size="1MiB", sets=("staging.capacity=4MiB", "ipc.acquire_timeout=10m"))

    def load(self, mnt, src):
        p = child(LOAD, (mnt, src))
        try:
            out, err = p.communicate(timeout=BOUND)
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            self.fail("the autoloaded torch.load took more than %ds: it waited for room (room_wait ignored)" % BOUND)
        self.assertEqual(p.returncode, 0, err.decode(errors="replace"))
        return json.loads(out.decode().strip().splitlines()[-1])

    def test_falls_back_when_the_capacity_is_held(self):
        import gdsfs
        import torch

        self.m.write("hold.bin", os.urandom(3 << 20))
        src = os.path.join(self.m.src, "t2.pt")
        torch.save({"x": torch.arange(256 << 10, dtype=torch.int64)}, src)  # 2 MiB
        mnt = self.m.path("t2.pt")
        held = gdsfs.open(self.m.path("hold.bin"), socket=self.m.sock)
        try:
            got = self.load(mnt, src)
        finally:
            held.close()
            gdsfs.disconnect()
        self.assertEqual(got["fallbacks"], {"refused:ENOSPC": 1})
        self.assertEqual(got["served"], {})
        self.assertTrue(got["same"])

        self.assertEqual(self.m.wait_stat("lease_held_bytes", 0), 0)
        got = self.load(mnt, src)  # room now: served from a lease
        self.assertEqual(got["fallbacks"], {})
        self.assertEqual(sum(got["served"].values()), 1, got)
        self.assertTrue(got["same"])


if __name__ == "__main__":
    unittest.main()
