"""What the GPU scripts beside this file share (autoload-gpu.py,
frameworks-gpu.py, readahead-gpu.py): their work directory check, the
daemon's start and stop, the tensors' checksum, a model's logits digest
and the versions they report. Python puts a script's own directory first
on sys.path, so they import it by name; `gdsfs bench` writes it out beside
the script it runs."""

import hashlib
import os
import stat
import subprocess
import time


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


def start_mount(bin, sets, src, mnt, log, **popen):
    """Starts `BIN mount --set KV... SRC MNT`, a KV for each of sets, its
    output to log, and waits (up to 60 s) until MNT serves (.gdsfs/version
    is there). Returns the daemon's Popen and whether it serves: not when it
    exited first or the time ran out."""
    args = [bin, "mount"]
    for kv in sets:
        args += ["--set", kv]
    proc = subprocess.Popen(args + [src, mnt], stdout=log, stderr=subprocess.STDOUT, **popen)
    for _ in range(600):
        if os.path.exists(os.path.join(mnt, ".gdsfs", "version")):
            return proc, True
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    return proc, False


def sh(cmd, **kw):
    return subprocess.run(cmd, check=True, **kw)


class MountBench:
    """Mounting and reading for a bench whose mount serves self.src on
    self.mnt, its daemon's output in self.work/daemon.log, its lease socket
    self.work/lease.sock; self.a holds the script's --bin and --set, and
    self.rels(path) names path's files relative to self.src."""

    def mount(self):
        self.log = open(os.path.join(self.work, "daemon.log"), "wb")
        sets = ["ipc.socket=" + os.path.join(self.work, "lease.sock")] + self.a.sets
        self.proc, up = start_mount(self.a.bin, sets, self.src, self.mnt, self.log)
        if not up:
            raise SystemExit("gdsfs mount did not come up; see %s/daemon.log" % self.work)

    def umount(self):
        self.proc.terminate()
        self.proc.wait(60)

    def warm_cache(self, path):
        """Reads path's files in SOURCE: their pages in the page cache."""
        for rel in self.rels(path):
            with open(os.path.join(self.src, rel), "rb") as f:
                while f.read(64 << 20):
                    pass


def checksum(tensors):
    """Of a {name: tensor} dict: names, dtypes, shapes, strides and two sums
    of each tensor's bytes (the second position-weighted), on its device."""
    import torch

    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name]
        h.update(("%s %s %s %s\n" % (name, t.dtype, tuple(t.shape), tuple(t.stride()))).encode())
        if t.numel():
            u = t.detach().contiguous().reshape(-1).view(torch.uint8).to(torch.int64)
            w = torch.arange(u.numel(), device=u.device, dtype=torch.int64) % 251 + 1
            h.update(("%d %d\n" % (int(u.sum()), int((u * w).sum()))).encode())
    return h.hexdigest()[:16]


def logits_digest(model):
    """The first 16 hex digits of the SHA-256 of a causal LM's logits (as
    float32) for one fixed input of 64 tokens, on the GPU."""
    import torch

    ids = (torch.arange(64, device="cuda") * 7919 % model.config.vocab_size).reshape(1, -1)
    with torch.no_grad():
        logits = model(ids).logits.float()
    return hashlib.sha256(logits.cpu().numpy().tobytes()).hexdigest()[:16]


def versions(*modules):
    """The versions of torch and of each of modules that imports."""
    import torch

    out = {"torch": torch.__version__}
    for mod in modules:
        try:
            out[mod] = __import__(mod).__version__
        except Exception:
            pass
    return out
