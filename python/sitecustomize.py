"""With gdsfs's python/ directory on PYTHONPATH, GDSFS_AUTOLOAD=1 enables
the gdsfs autoloader in every Python process that inherits the environment.
Either way it then runs the sitecustomize it hides (the next on sys.path)."""


def _gdsfs_boot():
    import os

    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(here, "gdsfs", "_bootstrap", "boot.py")
    ns = {"__name__": "_gdsfs_boot", "__file__": path}
    with open(path) as f:
        exec(compile(f.read(), path, "exec"), ns)
    ns["main"](os.environ.get("GDSFS_AUTOLOAD") == "1", here)


_gdsfs_boot()
del _gdsfs_boot
