"""Post-import patching: safetensors and torch are patched when the program
imports them, never imported by gdsfs itself. The import hook is the
bootstrap's (gdsfs/_bootstrap/boot.py, the module _gdsfs_boot), one per
process whether the bootstrap or `import gdsfs.autoload` came first. This
module keeps what each patch replaced, so that disable() puts it back."""

import logging
import sys
import threading

log = logging.getLogger("gdsfs.autoload")

_lock = threading.RLock()
_names = set()  # modules registered (patched when imported)
_done = set()  # modules patched in this process
_undo = []  # (object, attribute, original value), in patching order


def _boot():
    """The process's bootstrap module, _gdsfs_boot: the one gdsfs's
    sitecustomize loaded, else this package's _bootstrap/boot.py, which
    then becomes it (one finder per process whichever came first)."""
    boot = sys.modules.get("_gdsfs_boot")
    if boot is None:
        from .._bootstrap import boot as ours

        boot = sys.modules.setdefault("_gdsfs_boot", ours)
    return boot


def register(name, patcher):
    """Run patcher(module) once name is imported (now, if it already is)."""

    def run(module):
        with _lock:
            if name in _done:
                return
            _done.add(name)
        try:
            patcher(module)
        except Exception:
            # A library version we do not understand: leave it unpatched, and say so.
            log.warning("gdsfs autoload: could not patch %s; its loads are not served", name, exc_info=True)

    with _lock:
        _names.add(name)
    _boot().on_import(name, run)


def patched():
    with _lock:
        return set(_done)


def replace(obj, attr, value):
    """setattr(obj, attr, value), remembered for disable()."""
    with _lock:
        _undo.append((obj, attr, getattr(obj, attr)))
    setattr(obj, attr, value)


def remember(obj, attr, orig):
    """obj.attr is already a patched function (bound from a patched module):
    disable() puts orig there."""
    with _lock:
        if not any(o is obj and a == attr for o, a, _ in _undo):
            _undo.append((obj, attr, orig))


def disable():
    """Put every original back and stop waiting for imports."""
    with _lock:
        _boot().forget(_names)
        _names.clear()
        while _undo:
            obj, attr, orig = _undo.pop()
            setattr(obj, attr, orig)
        _done.clear()
