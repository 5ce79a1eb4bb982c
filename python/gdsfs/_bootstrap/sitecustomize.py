"""sitecustomize that `gdsfs run` puts first on PYTHONPATH: enables the
gdsfs autoloader in this interpreter (and, through the environment it
passes on, in every Python process started from it), then runs the
sitecustomize it hides. GDSFS_AUTOLOAD=0 turns it off."""


def _gdsfs_boot():
    import os

    here = os.path.dirname(os.path.abspath(__file__))
    pydir = os.path.dirname(os.path.dirname(here))  # the directory holding gdsfs/
    path = os.path.join(here, "boot.py")
    ns = {"__name__": "_gdsfs_boot", "__file__": path}
    with open(path) as f:
        exec(compile(f.read(), path, "exec"), ns)
    ns["main"](os.environ.get("GDSFS_AUTOLOAD", "1") != "0", pydir)


_gdsfs_boot()
del _gdsfs_boot
