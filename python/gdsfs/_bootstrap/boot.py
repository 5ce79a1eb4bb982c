"""What both sitecustomize files run, kept cheap for every interpreter
start: it imports nothing beyond what Python's start-up already has. It
puts a finder at the front of sys.meta_path that waits for the program to
import safetensors or torch; only then is gdsfs.autoload imported, and it
patches the module that was just run. Then it runs the sitecustomize that
ours hides (the next one on sys.path: Debian's, a virtualenv's, another
tool's), as opentelemetry-instrument and ddtrace-run do.

The sitecustomize files exec this file (importing it would import the gdsfs
package, and with it ctypes and logging, in every process)."""

import os
import sys

TARGETS = ("safetensors", "safetensors.torch", "torch.serialization", "torch")


class LazyFinder:
    """Finds nothing itself: wraps the exec_module of the target modules
    the other finders find."""

    def __init__(self):
        self.busy = set()

    def find_spec(self, fullname, path, target=None):
        if fullname not in TARGETS or fullname in self.busy:
            return None
        self.busy.add(fullname)
        try:
            spec = None
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
        finally:
            self.busy.discard(fullname)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        orig = loader.exec_module

        def exec_module(module):
            orig(module)
            if getattr(module, "__name__", None) == fullname:
                activate(fullname, module)

        try:
            loader.exec_module = exec_module
        except (AttributeError, TypeError):
            pass
        return spec


def activate(name, module):
    """Import gdsfs.autoload (its own hooks take over) and patch module."""
    try:
        import gdsfs.autoload
        from gdsfs.autoload import _hooks

        _hooks.run(name, module)
    except Exception as e:  # never break the program's import
        sys.stderr.write("gdsfs autoload: not enabled for %s: %s\n" % (name, e))
    for f in list(sys.meta_path):
        if isinstance(f, LazyFinder) or type(f).__name__ == "LazyFinder":
            try:
                sys.meta_path.remove(f)
            except ValueError:
                pass


def install():
    if any(type(f).__name__ == "LazyFinder" for f in sys.meta_path):
        return
    sys.meta_path.insert(0, LazyFinder())
    for name in TARGETS:  # imported before us (by another sitecustomize, say)
        m = sys.modules.get(name)
        if m is not None:
            activate(name, m)
            break


def _real(p):
    try:
        return os.path.realpath(p or os.getcwd())
    except OSError:
        return p


def chain(skip_dirs):
    """Run the first sitecustomize on sys.path outside skip_dirs, as the
    module sitecustomize; None when there is none."""
    import importlib.machinery

    skip = {_real(d) for d in skip_dirs}
    paths = [p for p in sys.path if _real(p) not in skip]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", paths)
    if spec is None or spec.loader is None:
        return None
    try:
        from importlib._bootstrap import module_from_spec
    except ImportError:  # pragma: no cover
        from importlib.util import module_from_spec
    ours = sys.modules.get("sitecustomize")
    mod = module_from_spec(spec)
    sys.modules["sitecustomize"] = mod
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        if ours is not None:
            sys.modules["sitecustomize"] = ours
        raise
    return mod


def main(enable, pydir):
    """enable: turn the autoloader on; pydir: the directory holding gdsfs/.
    The sitecustomize chained to is the first outside pydir and the
    bootstrap directory (both hold one of ours)."""
    if pydir not in sys.path:
        sys.path.append(pydir)
    if enable:
        install()
    chain([pydir, os.path.dirname(os.path.abspath(__file__))])
