"""Drops on the process's pooled connections against a real daemon on the
host backend (root, /dev/fuse): the daemon must go on holding what the
process still maps."""

import errno
import unittest

from _support import Mount, require_mount
from test_host import blob

import gdsfs


class DropPoolTests(unittest.TestCase):
    def setUp(self):
        require_mount(self)
        gdsfs.disconnect()
        self.addCleanup(gdsfs.disconnect)

    def test_drop_of_stale_mapping_keeps_the_kept_one(self):
        """A mapping made stale (its repeat lease refused) and a fresh
        mapping of the same file, leased afresh on the same pooled
        connection, name one held generation there. Undoing the stale one
        must not make the daemon let go of the bytes the kept fresh one
        still maps: it is leased again with no descriptors."""
        m = Mount(sets=["ipc.max_leases_per_uid=2"])
        self.addCleanup(m.stop)
        a, b = m.write("a.bin", blob(4096, 11)), m.write("b.bin", blob(4096, 12))
        a1 = gdsfs.open(a)
        lb = gdsfs.open(b)
        with self.assertRaises(OSError) as cm:
            gdsfs.open(a)  # a third lease: the repeat of a is refused, its mapping made stale
        self.assertEqual(cm.exception.errno, errno.EDQUOT, cm.exception)
        lb.close()  # kept
        a2 = gdsfs.open(a)  # afresh, on the pool's one connection
        self.assertEqual(a2.generation, a1.generation)
        a2.close()  # kept: the current mapping of a
        a1.close()  # the stale mapping of a: undone
        with gdsfs.open(b) as b2:  # on the same connection: reads the answers of a1's release and drop first
            self.assertTrue(b2.reused)
            st = m.stats()
            self.assertEqual((st["ipc_open_connections"], st["lease_held_files"]), (1, 2),
                             "a, mapped and kept, is no longer held by the daemon")
        with gdsfs.open(a) as a3:
            self.assertTrue(a3.reused, "a full grant: the kept mapping of a was no longer held")


if __name__ == "__main__":
    unittest.main()
