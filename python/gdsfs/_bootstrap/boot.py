"""gdsfs's bootstrap and its import hook, the only one in a process.

The sitecustomize beside gdsfs/ loads this file as the module _gdsfs_boot
(without importing the gdsfs package, and with it ctypes and logging, in
every process) and calls main(). gdsfs.autoload uses that module; where no
sitecustomize ran (an installed package) it imports this file as
gdsfs._bootstrap.boot and registers it as _gdsfs_boot, so a process has one
bootstrap and one finder whichever came first. It is kept cheap for every
interpreter start: it imports nothing beyond what Python's start-up
already has.

The finder sits at the front of sys.meta_path and finds nothing itself:
for the modules something waits for (on_import), it lets the other
finders find them and wraps the loader's exec_module, so the waiting
function runs right after the module has run. The bootstrap waits for
safetensors and torch; only when the program imports one is gdsfs.autoload
imported (from the directory the bootstrap came from), and its patchers
take over the waits.
"""

import _thread
import os
import sys

NAME = "_gdsfs_boot"
TARGETS = ("safetensors", "safetensors.torch", "torch.serialization", "torch")

_lock = _thread.RLock()
_waiting = {}  # module name -> fn(module), run once when the module has run
_finder = None  # the Finder on sys.meta_path while anything waits
_booted = False  # main() ran in this process


class Finder:
    def __init__(self):
        self._busy = set()  # (thread, module name) being found through the others

    def find_spec(self, fullname, path, target=None):
        if fullname not in _waiting:
            return None
        key = (_thread.get_ident(), fullname)
        if key in self._busy:
            return None
        self._busy.add(key)
        try:
            spec = None
            for finder in list(sys.meta_path):
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
        finally:
            self._busy.discard(key)
        loader = getattr(spec, "loader", None)
        if loader is not None and hasattr(loader, "exec_module"):
            _wrap(loader, fullname)
        return spec


def _wrap(loader, name):
    orig = loader.exec_module

    def exec_module(module):
        orig(module)
        if getattr(module, "__name__", None) == name:
            fire(name, module)

    try:
        loader.exec_module = exec_module
    except (AttributeError, TypeError):
        sys.stderr.write("gdsfs autoload: cannot hook the import of %s; its loads are not served\n" % name)


def _running(module):
    return bool(getattr(getattr(module, "__spec__", None), "_initializing", False))


def on_import(name, fn):
    """Run fn(module) once, when module name has run: now if it has (and
    is not still running), else right after the import that runs it.
    Replaces what waited for name before."""
    global _finder
    with _lock:
        _waiting[name] = fn
        if _finder is None:
            _finder = Finder()
            sys.meta_path.insert(0, _finder)
    m = sys.modules.get(name)
    if m is not None and not _running(m):
        fire(name, m)


def fire(name, module):
    """Run what waits for name (module has just run), once."""
    with _lock:
        fn = _waiting.pop(name, None)
        _drop_finder_locked()
    if fn is not None:
        fn(module)


def forget(names):
    """Stop waiting for names."""
    with _lock:
        for n in names:
            _waiting.pop(n, None)
        _drop_finder_locked()


def _drop_finder_locked():
    global _finder
    if _finder is not None and not _waiting:
        try:
            sys.meta_path.remove(_finder)
        except ValueError:
            pass
        _finder = None


def _exec_spec(name, spec):
    try:
        from importlib._bootstrap import module_from_spec
    except ImportError:  # pragma: no cover
        from importlib.util import module_from_spec
    prev = sys.modules.get(name)
    mod = module_from_spec(spec)
    sys.modules[name] = mod
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        if prev is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = prev
        raise
    return mod


def _activate(pydir):
    """What the bootstrap waits for safetensors and torch with: import
    gdsfs.autoload from pydir, whose patchers then wait for them, and
    patch the module that was just run."""

    def activate(module):
        try:
            if "gdsfs" not in sys.modules:
                import importlib.machinery

                spec = importlib.machinery.PathFinder.find_spec("gdsfs", [pydir])
                if spec is None or spec.loader is None:
                    raise ImportError("no gdsfs package in %s" % pydir)
                _exec_spec("gdsfs", spec)
            import gdsfs.autoload  # noqa: F401  (enables itself: on_import for every target)
        except Exception as e:  # never break the program's import
            forget(TARGETS)
            sys.stderr.write("gdsfs autoload: not enabled: %s\n" % e)
            return
        fire(module.__name__, module)

    return activate


def _ours(origin):
    """Whether the sitecustomize at origin is gdsfs's: beside gdsfs/, or
    beside boot.py in a _bootstrap/ directory (a layout older gdsfs run
    copies unpacked, still found in users' caches)."""
    d = os.path.dirname(origin)
    if os.path.isfile(os.path.join(d, "gdsfs", "_bootstrap", "boot.py")):
        return True
    return os.path.basename(d) == "_bootstrap" and os.path.isfile(os.path.join(d, "boot.py"))


def chain():
    """Run the first sitecustomize on sys.path that is not gdsfs's, as the
    module sitecustomize; None when there is none."""
    import importlib.machinery

    for entry in list(sys.path):
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", [entry])
        if spec is None or spec.loader is None or _ours(spec.origin or ""):
            continue
        return _exec_spec("sitecustomize", spec)
    return None


def main(enable, pydir):
    """The bootstrap, run by gdsfs's sitecustomize (pydir: the directory
    holding it and gdsfs/): with enable, wait for safetensors and torch;
    then run the sitecustomize it hides. Only the first call in a process
    does anything."""
    global _booted
    with _lock:
        if _booted:
            return
        _booted = True
    if enable:
        activate = _activate(pydir)
        for name in TARGETS:
            on_import(name, activate)
    chain()
