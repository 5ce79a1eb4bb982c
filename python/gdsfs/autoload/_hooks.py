"""Post-import hooks: safetensors and torch are patched when the program
imports them, never imported by gdsfs itself. A finder at the front of
sys.meta_path lets the other finders find the module, then wraps the
loader's exec_module so the patch runs as soon as the module has run."""

import logging
import sys
import threading

log = logging.getLogger("gdsfs.autoload")

_lock = threading.RLock()
_patchers = {}  # module name -> fn(module)
_done = set()  # module names patched in this process


def _patch(name, module):
    with _lock:
        if name in _done:
            return
        _done.add(name)
    try:
        _patchers[name](module)
    except Exception:
        # A library version we do not understand: leave it unpatched, and say so.
        log.warning("gdsfs autoload: could not patch %s; its loads are not served", name, exc_info=True)


class _Finder:
    def __init__(self):
        self._busy = threading.local()

    def find_spec(self, fullname, path, target=None):
        if fullname not in _patchers or fullname in _done:
            return None
        busy = getattr(self._busy, "names", None)
        if busy is None:
            busy = self._busy.names = set()
        if fullname in busy:
            return None
        busy.add(fullname)
        try:
            spec = None
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
        finally:
            busy.discard(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        _wrap(spec.loader, fullname)
        return spec


def _wrap(loader, fullname):
    orig = loader.exec_module

    def exec_module(module):
        orig(module)
        if getattr(module, "__name__", None) == fullname:
            _patch(fullname, module)

    try:
        loader.exec_module = exec_module
    except (AttributeError, TypeError):
        log.warning("gdsfs autoload: cannot hook the import of %s; its loads are not served", fullname)


_finder = None


def register(name, patcher):
    """Run patcher(module) once name is imported (now, if it already is)."""
    global _finder
    with _lock:
        _patchers[name] = patcher
        if _finder is None:
            _finder = _Finder()
            sys.meta_path.insert(0, _finder)
    m = sys.modules.get(name)
    if m is not None:
        _patch(name, m)


def run(name, module):
    """Patch module now (the bootstrap's finder saw it imported)."""
    if name in _patchers:
        _patch(name, module)


def patched():
    with _lock:
        return set(_done)


_undo = []  # (object, attribute, original value), in patching order


def replace(obj, attr, value):
    """setattr(obj, attr, value), remembered for disable()."""
    _undo.append((obj, attr, getattr(obj, attr)))
    setattr(obj, attr, value)


def remember(obj, attr, orig):
    """obj.attr is already a patched function (bound from a patched module):
    disable() puts orig there."""
    _undo.append((obj, attr, orig))


def disable():
    """Put every original back and stop hooking imports."""
    global _finder
    with _lock:
        while _undo:
            obj, attr, orig = _undo.pop()
            setattr(obj, attr, orig)
        _done.clear()
        _patchers.clear()
        if _finder is not None:
            try:
                sys.meta_path.remove(_finder)
            except ValueError:
                pass
            _finder = None
