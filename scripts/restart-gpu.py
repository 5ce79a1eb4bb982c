#!/usr/bin/env python3
"""A restart that keeps the GPU cache, on a GPU machine: files resident on
the GPU (default 8 x 2.5 GiB), a consumer holding a lease, a reader working
through the mount; then the daemon is restarted one of three ways
(--via): handover (default), a second `gdsfs mount` of the same SOURCE on
the same mount point takes over; restart, the daemon runs under a stand-in
for systemd's notify socket and file descriptor store (this script), is
stopped with SIGUSR2 (what `systemctl restart` sends with the shipped
unit's RestartKillSignal=) and started again with what the store holds;
crash, the same with SIGKILL. Prints one line per check (PASS, FAIL, or
MISS for a time target) and a JSON summary; exits 1 when a check fails
(wrong bytes, bytes staged again, the restart refused, a read through the
mount failing), 0 otherwise (a MISS is a figure, not a failure).

    python3 scripts/restart-gpu.py --bin .bin/gdsfs [--via handover|restart|crash] [--work /var/tmp/gdsfs-restart] [--files 8] [--size 2.5GiB]

Checks:
- the first daemon exits 0 and says it handed the mount over (handover)
  or kept it in the store (restart); the second says it took over or
  recovered the mount from the store;
- the successor holds every file resident and read 0 bytes from SOURCE;
- the lease held across the switch reads the same SHA-256 after it, and
  is still counted (handover, restart; a crash ends it);
- the first lease of each file after the switch, in a process that leased
  a small file before it (its CUDA context and first import predate the
  switch): SHA-256 of its bytes equals the file's; time <= 5 ms (MISS
  above), beside the same process's first lease of a resident file before
  the switch;
- a reader opening, reading and closing files through the mount in a loop
  from before the switch to after it: no failed operation; the longest
  single operation and the longest gap between two completed operations
  are reported (how long the mount did not answer).

Needs root, /dev/fuse, a GPU, torch and the gdsfs Python client
(PYTHONPATH=python).
"""

import argparse
import array
import concurrent.futures
import ctypes
import hashlib
import json
import os
import platform
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
CHUNK = 64 << 20


def parse_size(s):
    m = re.fullmatch(r"([0-9.]+)\s*([KMGT]i?B?)?", s.strip(), re.I)
    if not m:
        raise SystemExit("--size %r: not a size (e.g. 2.5GiB)" % s)
    mult = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[(m.group(2) or "")[:1].upper()]
    return int(float(m.group(1)) * mult) // 4096 * 4096


def write_file(path, size, seed):
    """Random bytes from a seeded generator; returns the file's SHA-256."""
    import numpy as np
    rng = np.random.default_rng(seed)
    h = hashlib.sha256()
    with open(path + ".tmp", "wb") as f:
        left = size
        while left:
            b = rng.bytes(min(CHUNK, left))
            h.update(b)
            f.write(b)
            left -= len(b)
    os.replace(path + ".tmp", path)
    return h.hexdigest()


def sources(src, files, size):
    """Writes the files (kept between runs when the manifest matches) and
    returns {name: sha256}."""
    os.makedirs(src, exist_ok=True)
    manifest = os.path.join(os.path.dirname(src), "manifest.json")
    names = ["w%d.bin" % i for i in range(files)]
    try:
        with open(manifest) as f:
            m = json.load(f)
        if m.get("size") == size and sorted(m["sha256"]) == sorted(names) and all(
                os.path.getsize(os.path.join(src, n)) == size for n in names):
            return m["sha256"]
    except (OSError, ValueError, KeyError):
        pass
    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        sums = dict(zip(names, ex.map(lambda i: write_file(os.path.join(src, names[i]), size, i + 1), range(files))))
    # Older than staging.racy_window, so the hand-over keeps them.
    past = time.time() - 3600
    for n in names:
        os.utime(os.path.join(src, n), (past, past))
    with open(manifest, "w") as f:
        json.dump({"size": size, "sha256": sums}, f)
    return sums


# A consumer process: CUDA context and connection made before the switch.
# Commands on stdin, one JSON line out per command.
CONSUMER = r'''
import hashlib, json, sys, time, torch, gdsfs
if torch.cuda.is_available():
    torch.cuda.init(); torch.empty(1, device="cuda"); torch.cuda.synchronize()

def sha(t):
    h = hashlib.sha256()
    for part in t.split(256 << 20):
        h.update(part.cpu().numpy().tobytes())
    return h.hexdigest()

held = None
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    cmd = json.loads(line)
    if cmd["op"] == "hold":
        held = gdsfs.open(cmd["path"])
        t = held.tensor()
        print(json.dumps({"sha256": sha(t), "ptr": held.ptr}), flush=True)
        del t
    elif cmd["op"] == "held":
        t = held.tensor()
        out = {"sha256": sha(t), "ptr": held.ptr}
        del t
        held.close()
        print(json.dumps(out), flush=True)
    elif cmd["op"] == "warm":
        gdsfs.open(cmd["path"]).close()
        print(json.dumps({"warm": True}), flush=True)
    elif cmd["op"] == "lease":
        out = []
        for p in cmd["paths"]:
            t0 = time.perf_counter()
            lease = gdsfs.open(p)
            ms = (time.perf_counter() - t0) * 1e3
            t = lease.tensor()
            out.append({"path": p, "ms": ms, "sha256": sha(t), "device": lease.device})
            del t
            lease.close()
        print(json.dumps(out), flush=True)
    elif cmd["op"] == "quit":
        break
'''

# A reader through the mount: open, pread 1 MiB, close, over the files in
# turn, until the stop file appears. Writes one JSON summary.
READER = r'''
import json, os, sys, time
mnt, names, stop, out = sys.argv[1], sys.argv[2].split(","), sys.argv[3], sys.argv[4]
blocks = int(sys.argv[5]) >> 20
ops = errs = 0
worst = gap = 0.0
last = time.monotonic()
first_err = None
i = 0
while not os.path.exists(stop):
    p = os.path.join(mnt, names[i % len(names)])
    t0 = time.monotonic()
    try:
        fd = os.open(p, os.O_RDONLY)
        try:
            b = os.pread(fd, 1 << 20, ((i * 7919) % blocks) << 20)
            if len(b) != 1 << 20:
                raise OSError("short read: %d" % len(b))
            os.fstat(fd)
        finally:
            os.close(fd)
        t1 = time.monotonic()
        worst = max(worst, t1 - t0)
        gap = max(gap, t1 - last)
        last = t1
        ops += 1
    except OSError as e:
        errs += 1
        if first_err is None:
            first_err = "%s: %s" % (p, e)
    i += 1
json.dump({"ops": ops, "errors": errs, "first_error": first_err,
           "longest_op_ms": worst * 1e3, "longest_gap_ms": gap * 1e3}, open(out, "w"))
'''


def ask(p, cmd):
    """Sends a command to a consumer process and returns its answer."""
    p.stdin.write(json.dumps(cmd) + "\n")
    p.stdin.flush()
    return json.loads(p.stdout.readline())


def consumer(env, warm=None):
    """Starts a consumer process and waits until it is ready; with warm, a
    path, it leases that file first."""
    p = subprocess.Popen([sys.executable, "-c", CONSUMER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True, env=env)
    assert json.loads(p.stdout.readline())["ready"]
    if warm:
        ask(p, {"op": "warm", "path": warm})
    return p


def quit_consumer(p, timeout=None):
    """Tells a consumer process to quit and waits for it."""
    p.stdin.write('{"op": "quit"}\n')
    p.stdin.close()
    p.wait(timeout=timeout)


PLACE = r'''
import os, sys
fds = [int(f) for f in sys.argv[1].split(",") if f]
high = max(fds + [2]) + len(fds) + 1
moved = [os.dup2(fd, high + i) for i, fd in enumerate(fds)]
for fd in fds:
    os.close(fd)
for i, fd in enumerate(moved):
    os.dup2(fd, 3 + i)
    os.close(fd)
if fds:
    os.environ["LISTEN_PID"] = str(os.getpid())
os.execv(sys.argv[2], sys.argv[2:])
'''


class Manager:
    """Plays systemd's part for one service: reads the daemon's
    notifications on a notify socket, keeps the descriptors it stores
    (FDSTORE=1, FDNAME=) as systemd does (every descriptor under a name,
    newest first, one that is the same open file as a kept one dropped),
    drops those it removes (FDSTOREREMOVE=1), answers BARRIER=1, and passes
    what it keeps to the next daemon ($LISTEN_FDS, $LISTEN_FDNAMES)."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="gdsfs-manager-")
        self.path = os.path.join(self.dir, "notify")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.store = []  # (name, fd), newest first
        self.lock = threading.Lock()
        self.ready = []
        self.cond = threading.Condition(self.lock)
        threading.Thread(target=self._read, daemon=True).start()

    def _same(self, a, b):
        nr = {"x86_64": 312, "aarch64": 272}.get(platform.machine())
        if nr is not None:
            libc = ctypes.CDLL(None, use_errno=True)
            pid = os.getpid()
            return libc.syscall(nr, pid, pid, 0, a, b) == 0  # kcmp(KCMP_FILE)
        sa, sb = os.fstat(a), os.fstat(b)
        return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)

    def _read(self):
        while True:
            try:
                msg, anc, _, _ = self.sock.recvmsg(65536, socket.CMSG_SPACE(253 * 4))
            except OSError:
                return
            fds = array.array("i")
            for level, kind, data in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
            fields = dict(l.split("=", 1) for l in msg.decode().splitlines() if "=" in l)
            with self.cond:
                if fields.get("FDSTORE") == "1" and len(fds) == 1:
                    if any(self._same(fd, fds[0]) for _, fd in self.store):
                        os.close(fds[0])
                    else:
                        self.store.insert(0, (fields.get("FDNAME", "stored"), fds[0]))
                    continue
                if fields.get("FDSTOREREMOVE") == "1":
                    for name, fd in [e for e in self.store if e[0] == fields.get("FDNAME")]:
                        os.close(fd)
                    self.store = [e for e in self.store if e[0] != fields.get("FDNAME")]
                for fd in fds:
                    os.close(fd)  # BARRIER=1's descriptor
                if "READY" in fields:
                    self.ready.append(int(fields.get("MAINPID", "0")))
                    self.cond.notify_all()

    def wait_ready(self, proc, secs=120):
        end = time.monotonic() + secs
        with self.cond:
            while proc.pid not in self.ready:
                if proc.poll() is not None:
                    raise SystemExit("the daemon (pid %d) exited with %s before READY=1" % (proc.pid, proc.returncode))
                if time.monotonic() > end:
                    raise SystemExit("no READY=1 from pid %d within %d s" % (proc.pid, secs))
                self.cond.wait(timeout=0.2)

    def start(self, cmd, log):
        """Starts cmd as the service's main process with what the store holds."""
        with self.lock:
            names = [n for n, _ in self.store]
            fds = [os.dup(fd) for _, fd in self.store]
        env = dict(os.environ, NOTIFY_SOCKET=self.path, FDSTORE="65536")
        if fds:
            env.update(LISTEN_FDS=str(len(fds)), LISTEN_FDNAMES=":".join(names))
        # The wrapper puts the descriptors at 3, 4, ... in order, says it is
        # LISTEN_PID and becomes the daemon (exec keeps the pid).
        p = subprocess.Popen([sys.executable, "-c", PLACE, ",".join(map(str, fds))] + cmd, env=env, pass_fds=fds,
                             stdout=log, stderr=subprocess.STDOUT)
        for fd in fds:
            os.close(fd)
        return p

    def names(self):
        with self.lock:
            return [n for n, _ in self.store]


def mount_cmd(args, src, mnt):
    return [args.bin, "mount", "--set", "staging.device=" + args.device, "--set", "staging.capacity=%dB" % args.capacity,
            "--set", "log.format=console", "--set", "shutdown.grace=5s", src, mnt]


def wait_for(pred, what, secs=60):
    end = time.monotonic() + secs
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.05)
    raise SystemExit("timed out waiting for " + what)


def stats(mnt):
    with open(os.path.join(mnt, ".gdsfs", "stats.json")) as f:
        return json.load(f)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", required=True)
    ap.add_argument("--work", default="/var/tmp/gdsfs-restart")
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--size", default="2.5GiB")
    ap.add_argument("--device", default="cuda", help="staging.device (host: a dry run on a machine with no GPU)")
    ap.add_argument("--via", default="handover", choices=("handover", "restart", "crash"),
                    help="how the daemon is restarted (see above)")
    args = ap.parse_args()
    size = parse_size(args.size)
    args.capacity = size * args.files + (4 << 30)
    src, mnt = os.path.join(args.work, "src"), os.path.join(args.work, "mnt")
    os.makedirs(mnt, exist_ok=True)
    t0 = time.monotonic()
    sums = sources(src, args.files, size)
    # A small file each consumer leases first: its process has leased
    # before (a running loader), so its first lease of each big file shows
    # the daemon's part, not the process's first import.
    warm = os.path.join(src, "warm.bin")
    with open(warm, "wb") as f:
        f.write(os.urandom(1 << 20))
    os.utime(warm, (time.time() - 3600,) * 2)
    names = sorted(sums)
    print("sources: %d x %d bytes ready in %.1f s" % (len(names), size, time.monotonic() - t0), flush=True)
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python"), PYTHONUNBUFFERED="1")
    logs = [open(os.path.join(args.work, "daemon-%d.log" % i), "w+") for i in (1, 2)]
    mgr = Manager() if args.via != "handover" else None
    if mgr:
        first = mgr.start(mount_cmd(args, src, mnt), logs[0])
        mgr.wait_ready(first)
    else:
        first = subprocess.Popen(mount_cmd(args, src, mnt), stdout=logs[0], stderr=subprocess.STDOUT)
    second = None
    results, fails = {}, []

    def check(ok, what, miss=False):
        word = "PASS" if ok else ("MISS" if miss else "FAIL")
        print("%s  %s" % (word, what), flush=True)
        if not ok and not miss:
            fails.append(what)

    try:
        wait_for(lambda: os.path.exists(os.path.join(mnt, ".gdsfs", "version")), "the first daemon's mount")
        # Stage every file: a lease in a short-lived process, bytes checked.
        stager = consumer(env)
        t1 = time.monotonic()
        staged = ask(stager, {"op": "lease", "paths": [os.path.join(mnt, n) for n in names]})
        quit_consumer(stager)
        results["stage_s"] = time.monotonic() - t1
        check(all(r["sha256"] == sums[os.path.basename(r["path"])] for r in staged),
              "staged before the switch: SHA-256 of every lease equals its file's")
        # Baseline: the first lease of a resident file in a fresh process, before the switch.
        base = consumer(env, warm=os.path.join(mnt, "warm.bin"))
        base_leases = ask(base, {"op": "lease", "paths": [os.path.join(mnt, names[-1])]})
        results["first_lease_before_switch_ms"] = base_leases[0]["ms"]
        quit_consumer(base)
        wait_for(lambda: stats(mnt).get("leases_active") == 0, "leases_active 0")
        before = stats(mnt)
        results["before"] = {k: before.get(k) for k in ("staged_files", "resident_bytes", "bytes_posix", "bytes_cufile",
                                                       "bytes_peer", "bytes_host")}

        holder = consumer(env)
        leaser = consumer(env, warm=os.path.join(mnt, "warm.bin"))
        held_before = ask(holder, {"op": "hold", "path": os.path.join(mnt, names[0])})
        stop = os.path.join(args.work, "reader.stop")
        rout = os.path.join(args.work, "reader.json")
        for p in (stop, rout):
            if os.path.exists(p):
                os.unlink(p)
        reader = subprocess.Popen([sys.executable, "-c", READER, mnt, ",".join(names), stop, rout, str(size)])
        # The reader is working through the mount before the switch.
        wait_for(lambda: stats(mnt).get("leases_active") == 1, "the held lease")
        time.sleep(0.5)

        if mgr:
            # The store holds everything once the state names the regions.
            wait_for(lambda: any(n.startswith("gdsfs-r") for n in mgr.names()), "the regions in the store")
        t2 = time.monotonic()
        if args.via == "handover":
            second = subprocess.Popen(mount_cmd(args, src, mnt), stdout=logs[1], stderr=subprocess.STDOUT)
            rc = first.wait(timeout=120)
            said, took = "handed the mount over", "took over"
        else:
            first.send_signal(signal.SIGUSR2 if args.via == "restart" else signal.SIGKILL)
            rc = first.wait(timeout=120)
            results["stop_s"] = time.monotonic() - t2
            second = mgr.start(mount_cmd(args, src, mnt), logs[1])
            said = "kept the mount, the leases and the cache in the descriptor store" if args.via == "restart" else None
            took = "recovered the mount"
        results["switch_s"] = time.monotonic() - t2
        logs[0].seek(0)
        log1 = logs[0].read()
        if said:
            check(rc == 0 and said in log1, "the first daemon exited 0 saying it %s (rc %s)" % (said, rc))

        def adopted():
            logs[1].seek(0)
            return took in logs[1].read()
        wait_for(adopted, "the second daemon's '%s'" % took)
        results["switch_to_took_over_s"] = time.monotonic() - t2
        if mgr:
            mgr.wait_ready(second)
            results["switch_to_ready_s"] = time.monotonic() - t2
        counted = stats(mnt).get("leases_active")  # the held lease alone

        after_leases = ask(leaser, {"op": "lease", "paths": [os.path.join(mnt, n) for n in names]})
        held_after = ask(holder, {"op": "held"})
        open(stop, "w").close()
        reader.wait(timeout=60)
        with open(rout) as f:
            rd = json.load(f)
        results["reader"] = rd
        for p in (leaser, holder):
            quit_consumer(p, timeout=60)

        after = stats(mnt)
        results["after"] = {k: after.get(k) for k in results["before"]}
        results["first_lease_after_switch_ms"] = {os.path.basename(r["path"]): round(r["ms"], 3) for r in after_leases}
        check(held_after["sha256"] == held_before["sha256"] == sums[names[0]],
              "the lease held across the switch reads its file's SHA-256 after it")
        if args.via != "crash":
            check(counted == 1, "the lease held across the switch is still counted (leases_active %s)" % counted)
        check(all(r["sha256"] == sums[os.path.basename(r["path"])] for r in after_leases),
              "first lease of each file after the switch: SHA-256 equals its file's")
        check(after.get("staged_files") == len(names) + 1,
              "the successor holds all %d files and warm.bin resident (staged_files %s)"
              % (len(names), after.get("staged_files")))
        again = sum((after.get(k) or 0) - (before.get(k) or 0) for k in ("bytes_posix", "bytes_cufile", "bytes_host"))
        results["bytes_staged_again"] = again
        check(again == 0, "bytes staged again by the successor: %d" % again)
        worst = max(r["ms"] for r in after_leases)
        check(worst <= 5, "first lease of each file after the switch <= 5 ms (slowest %.2f ms, before the switch %.2f ms)"
              % (worst, results["first_lease_before_switch_ms"]), miss=True)
        check(rd["errors"] == 0 and rd["ops"] > 0,
              "reader through the mount across the switch: %d operations, %d failed%s"
              % (rd["ops"], rd["errors"], ": " + rd["first_error"] if rd["first_error"] else ""))
        print("mount did not answer for at most %.1f ms (longest single open+read+close %.1f ms); hand-over %.3f s "
              "from the successor's start to the first daemon's exit" % (rd["longest_gap_ms"], rd["longest_op_ms"],
                                                                           results["switch_s"]), flush=True)
    finally:
        for p in (second, first):
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    p.kill()
        for i, lf in enumerate(logs):
            lf.seek(0)
            tail = lf.read().splitlines()[-12:]
            print("--- daemon %d log, last lines:\n%s" % (i + 1, "\n".join(tail)), flush=True)
    print(json.dumps(results, indent=1))
    if fails:
        print("RESTART FAILED (via %s): " % args.via + "; ".join(fails))
        sys.exit(1)
    print("RESTART PASSED (via %s)" % args.via)


if __name__ == "__main__":
    main()
