#!/usr/bin/env python3
"""Read-ahead across files on a GPU, in one run: a torch DataLoader over
--shards shards of --shard-mib MiB that leases each shard (gdsfs.load) and
checksums it on the device, nothing resident at the start, page cache
dropped before each case:

  off          staging.readahead_files=0, --workers workers
  on           the default window, recording a trace (staging.trace_entries)
  replay       a fresh mount with staging.replay=<the trace of "on">; the
               epoch starts as soon as the mount answers
  compute off  one worker that, after each shard, computes (a busy wait) as
               long as the disk takes to read one shard cold; read-ahead off
  compute on   the same with the default window

The disk is measured in the same run, page cache dropped: its cold read
rate (--io-threads readers over the shards) and the cold read time of one
shard (one reader, the median over up to 8 shards), which sets the compute
time. For each case: epoch time, time to first batch, the sum of per-shard
waits, the hit ratio (readahead_hits / shards from .gdsfs/stats.json).
Targets, each printed as a line "target GOAL PASS|MISS got op want":
  - compute: epoch with read-ahead on <= 0.65 x the epoch with it off
  - compute: first batch with read-ahead on no slower than with it off
  - on (--workers workers): shards / epoch time >= 0.95 x the cold read rate
  - replay: shards / epoch time >= 0.9 x the cold read rate

    make gpu-bundle    # where Go is: builds .bin/gdsfs
    python3 scripts/readahead-gpu.py --bin .bin/gdsfs [--work /var/tmp/gdsfs-readahead]

Needs root (FUSE mount, drop_caches), torch, and the gdsfs Python package
(python/ of this repository, found next to this script). Self-checking:
every shard's checksum must match in every case, and the trace must list
every shard; it exits 1 if a check fails or a target misses or is not
checked, 2 if the binary has no read-ahead (configuration keys missing).
Dry run on a machine with no GPU: --device host --shards 64 --shard-mib 1
--workers 4 --no-drop --dry-run (the targets say "not measured here"; the
times are the host's, not a disk's).
"""

import argparse
import json
import os
import subprocess
import sys
import threading
import time

from gpuscript import own_work_dir, start_mount

HERE = os.path.abspath(__file__)
REPO_PYTHON = os.path.join(os.path.dirname(os.path.dirname(HERE)), "python")


# ---- the loader, in a fresh interpreter per case ----------------------------

def checksum(t):
    """(sum of bytes, position-weighted sum) of a uint8 tensor, exact in int64."""
    import torch

    u = t.reshape(-1).to(torch.int64)
    w = torch.arange(u.numel(), device=u.device, dtype=torch.int64) % 251 + 1
    return int(u.sum()), int((u * w).sum())


class Shards:  # a torch Dataset (duck-typed: torch is imported in the worker)
    def __init__(self, paths, device, compute_s=0.0):
        self.paths, self.device, self.compute_s = paths, device, compute_s

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        import gdsfs
        import torch

        if i < 0:  # warm-up: start CUDA in this worker; touch no shard
            if self.device != "host" and torch.cuda.is_available():
                torch.empty(1, device="cuda")
                torch.cuda.synchronize()
            return (i, 0, 0, 0.0)
        t0 = time.perf_counter()
        t = gdsfs.load(self.paths[i])
        wait = time.perf_counter() - t0
        s1, s2 = checksum(t)
        del t
        busy(self.compute_s)
        return (i, s1, s2, wait)


def busy(seconds):
    """The consumer's compute on a shard: a busy wait of seconds."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


class Phases:  # a torch Sampler whose order the main process changes per epoch
    def __init__(self, order):
        self.order = list(order)

    def __iter__(self):
        return iter(list(self.order))

    def __len__(self):
        return len(self.order)


def loader(a):
    import torch
    from torch.utils.data import DataLoader

    paths = [os.path.join(a.mnt, "shards", "shard-%04d.bin" % i) for i in range(a.shards)]
    sampler = Phases([-1] * (2 * a.workers))
    dl = DataLoader(Shards(paths, a.device, a.compute_s), batch_size=None, sampler=sampler, num_workers=a.workers,
                    persistent_workers=True, prefetch_factor=2, collate_fn=lambda x: x)
    for _ in dl:  # the workers start and initialise CUDA before the clock runs
        pass
    sampler.order = list(range(a.shards))
    got, first = [], None
    t0 = time.perf_counter()
    for item in dl:
        if first is None:
            first = time.perf_counter() - t0
        got.append(item)
    epoch = time.perf_counter() - t0
    want = json.load(open(a.expect))
    bad = [i for i, s1, s2, _ in got if [s1, s2] != want[i]]
    missing = sorted(set(range(a.shards)) - {i for i, _, _, _ in got})
    print(json.dumps({"first_batch_s": first, "epoch_s": epoch, "sum_wait_s": sum(w for *_, w in got),
                      "max_wait_s": max(w for *_, w in got), "bad": bad, "missing": missing,
                      "torch": torch.__version__}))


# ---- the driver -------------------------------------------------------------

def drop_cache():
    subprocess.run(["sync"], check=True)
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


class Mount:
    def __init__(self, a, sets):
        self.a, self.mnt = a, os.path.join(a.work, "mnt")
        os.makedirs(self.mnt, exist_ok=True)
        keys = ["log.format=json", "ipc.socket=" + os.path.join(a.work, "lease.sock")]
        if a.device == "host":
            keys.append("staging.device=host")
        keys += a.sets + sets  # the caller's keys, then this mode's (which win)
        self.log = open(os.path.join(a.work, "daemon.log"), "ab")
        self.proc, up = start_mount(a.bin, keys, os.path.join(a.work, "src"), self.mnt, self.log, stdin=subprocess.DEVNULL)
        if up:
            return
        self.stop()
        raise SystemExit("gdsfs mount %s did not come up; see %s/daemon.log" % (" ".join(sets), a.work))

    def read(self, name):
        with open(os.path.join(self.mnt, ".gdsfs", name), "rb") as f:
            return f.read()

    def stats(self):
        return json.loads(self.read("stats.json"))

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if os.path.ismount(self.mnt):
            subprocess.run(["umount", "-l", self.mnt], stderr=subprocess.DEVNULL)


class Run:
    def __init__(self, a):
        self.a = a
        self.shard_bytes = a.shard_mib << 20
        self.results = {"shards": a.shards, "shard_bytes": self.shard_bytes, "workers": a.workers,
                        "device": a.device, "cases": {}, "checks": {}}

    def make_shards(self):
        """SOURCE/shards/shard-NNNN.bin of random bytes, and their checksums."""
        import torch

        d = os.path.join(self.a.work, "src", "shards")
        os.makedirs(d, exist_ok=True)
        self.expect = os.path.join(self.a.work, "checksums-%d-%d.json" % (self.a.shards, self.a.shard_mib))
        if os.path.exists(self.expect) and all(
                os.path.exists(self.path(i)) and os.path.getsize(self.path(i)) == self.shard_bytes
                for i in range(self.a.shards)):
            return
        sums = []
        g = torch.Generator().manual_seed(10)
        for i in range(self.a.shards):
            t = torch.randint(0, 256, (self.shard_bytes,), dtype=torch.uint8, generator=g)
            with open(self.path(i), "wb") as f:
                f.write(t.numpy().tobytes())
            sums.append(list(checksum(t)))
        for name in os.listdir(d):  # nothing else in the directory: name order is the shards
            if name not in {os.path.basename(self.path(i)) for i in range(self.a.shards)}:
                os.unlink(os.path.join(d, name))
        with open(self.expect, "w") as f:
            json.dump(sums, f)

    def path(self, i):
        return os.path.join(self.a.work, "src", "shards", "shard-%04d.bin" % i)

    def cold(self):
        """The disk's cold read rate over the shards (bytes/s)."""
        if not self.a.no_drop and not drop_cache():
            raise SystemExit("cannot drop the page cache (root needed); --no-drop for a dry run")
        todo, lock, total = list(range(self.a.shards)), threading.Lock(), [0]

        def reader():
            buf = bytearray(16 << 20)
            while True:
                with lock:
                    if not todo:
                        return
                    i = todo.pop(0)
                fd = os.open(self.path(i), os.O_RDONLY)
                try:
                    while True:
                        n = os.readv(fd, [buf])
                        if n == 0:
                            break
                        with lock:
                            total[0] += n
                finally:
                    os.close(fd)

        t0 = time.perf_counter()
        ts = [threading.Thread(target=reader) for _ in range(self.a.io_threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        secs = time.perf_counter() - t0
        self.results["cold"] = {"bytes": total[0], "seconds": secs, "gbps": total[0] / secs / 1e9,
                                "page_cache_dropped": not self.a.no_drop}
        print("cold read: %.2f GB/s (%d threads)" % (total[0] / secs / 1e9, self.a.io_threads), file=sys.stderr)

    def shard_time(self):
        """The cold read time of one shard: one reader, page cache dropped,
        the median over up to 8 shards (seconds)."""
        if not self.a.no_drop and not drop_cache():
            raise SystemExit("cannot drop the page cache (root needed); --no-drop for a dry run")
        buf, times = bytearray(16 << 20), []
        for i in range(min(8, self.a.shards)):
            t0 = time.perf_counter()
            fd = os.open(self.path(i), os.O_RDONLY)
            try:
                while os.readv(fd, [buf]):
                    pass
            finally:
                os.close(fd)
            times.append(time.perf_counter() - t0)
        times.sort()
        self.results["shard_read_s"] = times[len(times) // 2]
        print("cold read of one shard: %.4f s (median of %d)" % (self.results["shard_read_s"], len(times)), file=sys.stderr)

    def epoch(self, m, workers, compute_s):
        env = dict(os.environ, PYTHONPATH=REPO_PYTHON + os.pathsep + os.environ.get("PYTHONPATH", ""))
        cmd = [self.a.python, HERE, "loader", "--mnt", m.mnt, "--shards", str(self.a.shards),
               "--workers", str(workers), "--device", self.a.device, "--expect", self.expect,
               "--compute-s", repr(compute_s)]
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        if r.returncode:
            raise SystemExit("loader failed:\n" + r.stderr.decode(errors="replace")[-4000:])
        return json.loads(r.stdout.decode().strip().splitlines()[-1])

    def case(self, name, sets, keep_trace=False, workers=None, compute_s=0.0):
        if not self.a.no_drop and not drop_cache():
            raise SystemExit("cannot drop the page cache (root needed); --no-drop for a dry run")
        workers = self.a.workers if workers is None else workers
        m = Mount(self.a, sets)
        try:
            r = self.epoch(m, workers, compute_s)
            s = m.stats()
            if keep_trace:
                with open(self.trace, "wb") as f:
                    f.write(m.read("trace"))
        finally:
            m.stop()
        keys = ("readahead_issued", "readahead_hits", "readahead_wasted_bytes", "readahead_cancelled",
                "readahead_declined", "hits", "misses", "bytes_cufile", "bytes_posix", "bytes_host")
        r["stats"] = {k: s[k] for k in keys if k in s}
        r["gbps"] = self.a.shards * self.shard_bytes / r["epoch_s"] / 1e9
        r["workers"], r["compute_s"] = workers, compute_s
        if "readahead_hits" in s:
            r["hit_ratio"] = s["readahead_hits"] / self.a.shards
        self.results["cases"][name] = r
        print("%-8s epoch %.3f s (%.2f GB/s), first batch %.3f s, waits %.3f s, hit ratio %s" % (
            name, r["epoch_s"], r["gbps"], r["first_batch_s"], r["sum_wait_s"], r.get("hit_ratio", "-")),
            file=sys.stderr)
        return r

    def has_readahead(self):
        m = Mount(self.a, [])
        try:
            return b"readahead_files" in m.read("config")
        finally:
            m.stop()

    def run(self):
        self.make_shards()
        self.cold()
        self.shard_time()
        self.trace = os.path.join(self.a.work, "epoch.trace")
        if not self.has_readahead():
            self.results["readahead"] = "not in this binary (no staging.readahead_files key)"
            self.case("baseline", [])
            return
        self.results["readahead"] = "yes"
        self.case("off", ["staging.readahead_files=0"])
        self.case("on", ["staging.trace_entries=%d" % (4 * self.a.shards)], keep_trace=True)
        self.case("replay", ["staging.replay=" + self.trace])
        c = self.results["shard_read_s"]
        self.case("compute off", ["staging.readahead_files=0"], workers=1, compute_s=c)
        self.case("compute on", [], workers=1, compute_s=c)

    def verdicts(self):
        c, checks = self.results["cases"], self.results["checks"]
        for name, r in c.items():
            checks[name + ": every shard's bytes match"] = not r["bad"] and not r["missing"]
        self.results["page_cache_dropped"] = not self.a.no_drop
        if "on" not in c:
            return
        paths = [ln for ln in open(self.trace).read().splitlines() if ln and not ln.startswith("#")]
        want = ["shards/shard-%04d.bin" % i for i in range(self.a.shards)]
        checks["trace lists every shard once"] = sorted(paths) == want
        checks["on: read-ahead engaged (hit ratio >= 0.5)"] = c["on"].get("hit_ratio", 0) >= 0.5
        checks["replay: hit ratio >= 0.9"] = c["replay"].get("hit_ratio", 0) >= 0.9
        self.results["speedup_on_vs_off"] = c["off"]["epoch_s"] / c["on"]["epoch_s"]
        cold, w = self.results["cold"]["gbps"], self.a.workers
        off, on = c.get("compute off"), c.get("compute on")
        self.results["targets"] = [
            target("1 worker computing a shard's read time: epoch on <= 0.65 x off",
                   on and on["epoch_s"], off and 0.65 * off["epoch_s"], "s", True),
            target("1 worker computing: first batch, read-ahead on <= off",
                   on and on["first_batch_s"], off and off["first_batch_s"], "s", True),
            target("%d workers, cold: epoch, read-ahead on >= 0.95 x disk cold rate" % w,
                   c["on"]["gbps"], 0.95 * cold, "GB/s", False),
            target("%d workers, cold: epoch, trace replay >= 0.9 x disk cold rate" % w,
                   c["replay"]["gbps"], 0.9 * cold, "GB/s", False),
        ]
        if self.a.dry_run:
            for t in self.results["targets"]:
                t["status"] = "not measured here: dry run (host backend, page cache kept: the times are not a disk's)"

    def status(self):
        """The exit status: 0 when every check and every target passed (or
        is not measured here), else 1."""
        ok = all(self.results["checks"].values()) and all(
            t["status"] == "PASS" or t["status"].startswith("not measured here") for t in self.results.get("targets", []))
        return 0 if ok else 1

    def table(self):
        cold = self.results["cold"]
        rows = ["| case | workers | compute s per shard | epoch s | GB/s | / cold rate | first batch s | sum of waits s | hit ratio | issued | wasted B |",
                "|---|---|---|---|---|---|---|---|---|---|---|"]
        for name, r in self.results["cases"].items():
            s = r["stats"]
            rows.append("| %s | %d | %.4f | %.3f | %.2f | %.2f | %.3f | %.3f | %s | %s | %s |" % (
                name, r["workers"], r["compute_s"], r["epoch_s"], r["gbps"], r["gbps"] / cold["gbps"], r["first_batch_s"], r["sum_wait_s"],
                "%.2f" % r["hit_ratio"] if "hit_ratio" in r else "-", s.get("readahead_issued", "-"),
                s.get("readahead_wasted_bytes", "-")))
        rows.append("| disk cold read | %d | | %.3f | %.2f | 1.00 | | | | | |" % (self.a.io_threads, cold["seconds"], cold["gbps"]))
        rows.append("\ncold read of one shard, one reader: %.4f s" % self.results["shard_read_s"])
        if "speedup_on_vs_off" in self.results:
            rows.append("read-ahead on vs off: %.2fx the epoch speed" % self.results["speedup_on_vs_off"])
        c = self.results["cases"]
        if "compute on" in c and "compute off" in c:
            rows.append("1 worker computing: epoch on / off %.3f, first batch on / off %.3f" % (
                c["compute on"]["epoch_s"] / c["compute off"]["epoch_s"],
                c["compute on"]["first_batch_s"] / c["compute off"]["first_batch_s"]))
        rows.append("")
        for k, ok in self.results["checks"].items():
            rows.append(target_line({"goal": k, "status": "PASS" if ok else "FAIL"}))
        for t in self.results.get("targets", []):
            rows.append(target_line(t))
        return "\n".join(rows)


def target(goal, got, want, unit, at_most):
    """A target as `gdsfs bench` prints them: PASS, MISS, or not checked
    where a figure is missing."""
    t = {"goal": goal, "got": got or 0, "want": want or 0, "unit": unit, "at_most": at_most}
    if not got or not want:
        t["status"] = "not checked: a case it needs did not run"
    elif (got <= want) if at_most else (got >= want):
        t["status"] = "PASS"
    else:
        t["status"] = "MISS"
    return t


def num(v):
    return "-" if v == 0 else "%.3f" % v if v < 10 else "%.2f" % v


def target_line(t):
    """One line, as the Go benches print a target."""
    if t["status"] not in ("PASS", "MISS") or not t.get("unit"):
        return "target  %-62s %s" % (t["goal"], t["status"])
    op = "<=" if t["at_most"] else ">="
    if t["status"] == "MISS":
        op = {"<=": "> ", ">=": "< "}[op]
    return "target  %-62s %s  %s %s %s %s" % (t["goal"], t["status"], num(t["got"]), op, num(t["want"]), t["unit"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="mode")
    ld = sub.add_parser("loader")
    for k in ("--mnt", "--expect", "--device"):
        ld.add_argument(k, required=True)
    ld.add_argument("--shards", type=int, required=True)
    ld.add_argument("--workers", type=int, required=True)
    ld.add_argument("--compute-s", type=float, default=0.0, help="busy wait after each shard (seconds)")
    ap.add_argument("--bin", default=os.path.join(os.path.dirname(HERE), "..", ".bin", "gdsfs"))
    ap.add_argument("--work", default="/var/tmp/gdsfs-readahead", help="on a disk filesystem (not tmpfs)")
    ap.add_argument("--shards", type=int, default=64)
    ap.add_argument("--shard-mib", type=int, default=32)
    ap.add_argument("--workers", type=int, default=4, help="DataLoader workers")
    ap.add_argument("--io-threads", type=int, default=8, help="readers measuring the cold read rate")
    ap.add_argument("--device", choices=("auto", "host"), default="auto")
    ap.add_argument("--python", default=sys.executable, help="the python that runs the loader (needs torch)")
    ap.add_argument("--no-drop", action="store_true", help="leave the page cache (results are then warm)")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                    help="a config.yaml key for every mount (repeatable; gdsfs bench readahead passes its --set here)")
    ap.add_argument("--dry-run", action="store_true", help="report targets without enforcing them")
    a = ap.parse_args()
    if a.mode == "loader":
        return loader(a)
    a.bin, a.work = os.path.abspath(a.bin), own_work_dir(a.work)
    r = Run(a)
    r.run()
    r.verdicts()
    print(json.dumps(r.results, indent=1))
    print()
    print(r.table())
    if r.results["readahead"] != "yes":
        print("\nread-ahead is not in this binary: only the baseline ran", file=sys.stderr)
        return 0 if a.dry_run else 2
    return r.status()


if __name__ == "__main__":
    sys.exit(main())
