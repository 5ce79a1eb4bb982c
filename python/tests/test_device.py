"""The device a lease names by default (gdsfs._device): unit tests, no
daemon, no GPU."""

import os
import sys
import types
import unittest
from unittest import mock

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from gdsfs import _device  # noqa: E402


class DefaultDeviceTests(unittest.TestCase):
    def setUp(self):
        self.env = mock.patch.dict(os.environ, {}, clear=False)
        self.env.start()
        for k in ("GDSFS_DEVICE", "CUDA_VISIBLE_DEVICES"):
            os.environ.pop(k, None)
        _device.forget()
        self.addCleanup(self.env.stop)
        self.addCleanup(_device.forget)

    def default(self, driver=False):
        with mock.patch.object(_device.os.path, "exists", return_value=driver):
            _device.forget()
            return _device.default_device()

    def test_gdsfs_device_wins(self):
        os.environ["GDSFS_DEVICE"] = "host1"
        os.environ["CUDA_VISIBLE_DEVICES"] = "GPU-aaaa"
        self.assertEqual(self.default(), "host1")
        os.environ["GDSFS_DEVICE"] = "none"
        self.assertIsNone(self.default(driver=True))

    def test_visible_devices(self):
        os.environ["CUDA_VISIBLE_DEVICES"] = "GPU-5b3f0a1c-0000-1111-2222-333344445555,GPU-other"
        self.assertEqual(self.default(), "GPU-5b3f0a1c-0000-1111-2222-333344445555")
        os.environ["CUDA_VISIBLE_DEVICES"] = "1,0"
        self.assertEqual(self.default(), "1")  # the daemon's ordinal 1: the same device
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        self.assertIsNone(self.default(driver=True))  # nothing visible

    def test_no_gpu_names_nothing(self):
        self.assertIsNone(self.default(driver=False))
        self.assertEqual(self.default(driver=True), "0")

    def test_torch_current_device(self):
        cuda = types.SimpleNamespace(is_initialized=lambda: True, current_device=lambda: 3)
        fake = types.SimpleNamespace(cuda=cuda)
        with mock.patch.dict(sys.modules, {"torch": fake}), \
                mock.patch("gdsfs._cuda.driver", side_effect=RuntimeError("no libcuda")):
            # The UUID comes from the driver torch loaded; without one, the ordinal.
            self.assertEqual(self.default(), "3")
        cuda.is_initialized = lambda: False
        with mock.patch.dict(sys.modules, {"torch": fake}):
            os.environ["CUDA_VISIBLE_DEVICES"] = "2"
            self.assertEqual(self.default(), "2")

    def test_resolve(self):
        os.environ["GDSFS_DEVICE"] = "GPU-x"
        self.assertEqual(_device.resolve(None), "GPU-x")
        self.assertIsNone(_device.resolve(""))
        self.assertIsNone(_device.resolve("none"))
        self.assertEqual(_device.resolve(1), "1")


if __name__ == "__main__":
    unittest.main()
