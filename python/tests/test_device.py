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


class FindDeviceTests(unittest.TestCase):
    """_cuda.Driver.find, over a driver whose calls are Python stand-ins."""

    def fake(self, uuids):
        from gdsfs import _cuda

        d = _cuda.Driver.__new__(_cuda.Driver)  # no libcuda: the calls below stand in for it
        d._found = {}
        calls = []

        def call(name, fn):
            def f(*args):
                calls.append(name)
                fn(*args)
                return 0
            f.name_ = name
            return f

        def count(p):
            p._obj.value = len(uuids)

        def get(p, i):
            p._obj.value = 100 + i

        def uuid(u, dev):
            u._obj.bytes[:] = bytes.fromhex(uuids[dev - 100])

        d.DeviceGetCount = call("cuDeviceGetCount", count)
        d.DeviceGet = call("cuDeviceGet", get)
        d.DeviceGetUuid = call("cuDeviceGetUuid", uuid)
        return d, calls

    def test_a_device_is_looked_up_once(self):
        """The ordinal of a lease's device is found by its UUID once per
        process (a process's devices do not change), not once per mapping;
        a UUID it does not have is refused every time, naming what it has."""
        from gdsfs import _cuda

        uuids = ["00" * 16, "ab" * 16]
        d, calls = self.fake(uuids)
        name = _cuda.format_uuid(bytes.fromhex(uuids[1])).upper()
        self.assertEqual(d.find(name), (1, 101))
        looked = len(calls)
        for _ in range(3):
            self.assertEqual(d.find(name.lower()), (1, 101))
        self.assertEqual(len(calls), looked, "the device was looked up again: %s" % calls[looked:])
        for _ in range(2):
            with self.assertRaisesRegex(RuntimeError, "GPU-0000"):
                d.find("GPU-ffffffff-ffff-ffff-ffff-ffffffffffff")


if __name__ == "__main__":
    unittest.main()
