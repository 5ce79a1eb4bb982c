"""The work directory check the GPU scripts beside this file share
(autoload-gpu.py, frameworks-gpu.py, readahead-gpu.py). Python puts a
script's own directory first on sys.path, so they import it by name; `gdsfs
bench` writes it out beside the script it runs."""

import os
import stat


def own_work_dir(path):
    """Makes path (0700 where missing) and refuses it unless it and every
    directory above it are owned by root or us and writable by no one else
    (sticky ones above it excepted), with no other user's link on the way:
    a work directory another user made could hold their links or modules."""
    path = os.path.abspath(path)
    os.makedirs(path, mode=0o700, exist_ok=True)
    me = os.geteuid()
    parts = path.strip("/").split("/")
    for i in range(len(parts) + 1):
        p = "/" + "/".join(parts[:i])
        st = os.lstat(p)
        if st.st_uid not in (0, me):
            raise SystemExit("--work %s: %s is owned by uid %d (use a work directory of yours that no one else may write)" % (path, p, st.st_uid))
        if stat.S_ISLNK(st.st_mode):
            continue
        last = i == len(parts)
        if st.st_mode & 0o022 and (last or not st.st_mode & stat.S_ISVTX):
            raise SystemExit("--work %s: %s is writable by group or other (mode %04o; use a work directory of yours that no one else may write)" % (path, p, stat.S_IMODE(st.st_mode)))
    real = os.path.realpath(path)
    if real != path:
        own_work_dir(real)
    return path
