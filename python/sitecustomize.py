"""gdsfs's bootstrap. With this directory on PYTHONPATH (`gdsfs run` puts
it first), GDSFS_AUTOLOAD=1 enables the gdsfs autoloader in every Python
process that inherits the environment. Either way it then runs the
sitecustomize it hides: the first on sys.path that is not gdsfs's, so
several copies of gdsfs on sys.path still bootstrap once."""


def _gdsfs_boot():
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    boot = sys.modules.get("_gdsfs_boot")
    if boot is None:
        path = os.path.join(here, "gdsfs", "_bootstrap", "boot.py")
        with open(path) as f:
            code = compile(f.read(), path, "exec")
        boot = type(sys)("_gdsfs_boot")
        boot.__file__ = path
        exec(code, boot.__dict__)
        boot = sys.modules.setdefault("_gdsfs_boot", boot)
    boot.main(os.environ.get("GDSFS_AUTOLOAD") == "1", here)


_gdsfs_boot()
del _gdsfs_boot
