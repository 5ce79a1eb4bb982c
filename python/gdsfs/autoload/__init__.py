"""gdsfs autoloader: unmodified safetensors and torch.load calls served
from gdsfs leases.

Importing this module enables it in this process; `gdsfs run COMMAND`
enables it in every Python process COMMAND starts (gdsfs's sitecustomize on
PYTHONPATH), as does GDSFS_AUTOLOAD=1 with gdsfs's python/ directory on
PYTHONPATH (docs/run.md). Patched, once the program imports them (nothing is imported
early):

- safetensors.torch.load_file(path, device=...)
- safetensors.safe_open(path, framework="pt", device=...): keys(),
  offset_keys(), metadata(), get_tensor(), get_slice()[...]
- torch.load(path or file, map_location=..., weights_only=..., mmap=...)
  of torch.save zip checkpoints
- Tensor.to, .cuda and .copy_ moving a CPU tensor that maps a file under a
  gdsfs mount to a GPU (docs/frameworks.md)

for files under a gdsfs mount. The tensors are copies out of the lease onto
the device asked for (device to device on a GPU mount): ordinary writable
tensors equal to the original call's. GDSFS_ZERO_COPY=1 returns read-only
views of the staged bytes instead. Everything else goes to the original
function, counted by reason (fallbacks(), the daemon's stats) and logged
once per reason. See python/README.md and the README's "Unmodified loaders".
"""

from . import _ahead, _hooks
from ._report import fallbacks, served, reset

__all__ = ["disable", "enable", "enabled", "fallbacks", "served", "reset"]


def _patch_safetensors(mod):
    from . import _safetensors

    orig = getattr(mod, "safe_open", None)
    if orig is not None and getattr(orig, "_gdsfs_original", None) is None:
        _hooks.replace(mod, "safe_open", _safetensors.patch_safe_open(orig))


def _patch_safetensors_torch(mod):
    from . import _safetensors

    orig = getattr(mod, "load_file", None)
    if orig is not None and getattr(orig, "_gdsfs_original", None) is None:
        _hooks.replace(mod, "load_file", _safetensors.patch_load_file(orig))
    so = getattr(mod, "safe_open", None)
    if so is not None:
        if getattr(so, "_gdsfs_original", None) is None:
            _hooks.replace(mod, "safe_open", _safetensors.patch_safe_open(so))
        else:  # bound from the patched safetensors package
            _hooks.remember(mod, "safe_open", so._gdsfs_original)


def _patch_torch_serialization(mod):
    import sys

    from . import _torchload

    _torchload.install(mod, sys.modules.get("torch"))


def _patch_torch(mod):
    # torch/__init__ binds torch.load from torch.serialization after that
    # module ran: either the patched load (torch.serialization was patched
    # first), which disable() must still put back, or the original.
    ser = getattr(mod, "serialization", None)
    load = getattr(ser, "load", None)
    orig = getattr(load, "_gdsfs_original", None)
    if orig is not None:
        if getattr(mod, "load", None) is orig:
            _hooks.replace(mod, "load", load)
        elif getattr(mod, "load", None) is load:
            _hooks.remember(mod, "load", orig)
    from . import _moves

    _moves.install(mod)


def _patch_numpy(mod):
    from . import _moves

    _moves.install_numpy(mod)


_enabled = False


def enable():
    """Patch safetensors and torch now if they are imported, else when
    they are (idempotent)."""
    global _enabled
    _hooks.register("safetensors", _patch_safetensors)
    _hooks.register("safetensors.torch", _patch_safetensors_torch)
    _hooks.register("torch.serialization", _patch_torch_serialization)
    _hooks.register("torch", _patch_torch)
    _hooks.register("numpy", _patch_numpy)
    _ahead.turn(True)
    _enabled = True


def enabled():
    return _enabled


def disable():
    """Put every patched function back (torch.load, torch.serialization's,
    safetensors') and stop patching imports in this process; enable()
    patches again. Children started later still get what their
    environment says."""
    global _enabled
    _hooks.disable()
    _ahead.turn(False)
    _release_kept_leases()
    _enabled = False


def _release_kept_leases():
    import sys

    moves = sys.modules.get(__name__ + "._moves")
    if moves is not None:
        moves.release()


enable()
