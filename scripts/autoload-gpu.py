#!/usr/bin/env python3
"""The autoloader on a GPU, in one run: speed and correctness of
unmodified loaders plain vs under `gdsfs run`. Prints one JSON object and a
markdown table (docs/benchmarks.md, "Unmodified loaders").

    python3 scripts/autoload-gpu.py --bin .bin/gdsfs [--work /tmp/gdsfs-autoload] [--size-gib 4]
    python3 scripts/autoload-gpu.py --bin bin/gdsfs --dry-run   # any machine: no GPU, safetensors, transformers

--dry-run (what `gdsfs bench autoload` runs on the host backend) goes
through the same work directory, file making, mount, warmup and unmount
with only the torch.save file, small and made on the CPU, and checks that
its bytes read through the mount are SOURCE's: nothing is timed.

Needs root, /dev/fuse, a GPU, torch, safetensors and transformers (nothing
is downloaded: the model is made here with random weights). Measured, each
in a fresh interpreter, median of --repeat runs (the cases of one
loader interleaved round by round, each after the staging a previous case
left is finished and evicted):
- safetensors.torch.load_file(FILE, device="cuda") of a --size-gib file:
  plain from SOURCE and through the mount (page cache warm, and dropped),
  and under `gdsfs run` with the file resident, and not yet staged (warm
  and dropped page cache). Targets: resident >= 20x plain; not staged no
  slower than plain; plain through the mount >= 0.95 of plain from SOURCE
  (warm and cold). A target whose cases --cases left out is "not
  measured"; one whose case could not run as asked (the page cache could
  not be dropped for a cold case) is "not checked" and fails the run, as
  does a measured target that failed.
- transformers from_pretrained(DIR, device_map="cuda") of a >= 2 GiB model:
  the same cases, with identical state-dict checksums and logits required.
- torch.load(FILE, map_location="cuda") of a torch.save state dict.
- correctness under `gdsfs run` against the libraries themselves on CUDA:
  load_file, safe_open get_tensor/get_slice, torch.load (dtype, shape,
  stride, bytes), for the test fixtures and the big files; every one of
  those calls must have been served (a call that fell back compares the
  library with itself).
Before each case that needs the file not staged, the file is evicted and
.gdsfs/cache must then not list it.
"""

import argparse
import hashlib
import json
import os
import re
import statistics
import subprocess
import sys
import time

from gpuscript import MountBench, checksum, logits_digest, own_work_dir, sh, versions

HERE = os.path.abspath(__file__)


# ---- measuring, inside one fresh interpreter ---------------------------------

def measure(a):
    import torch

    torch.cuda.init()
    torch.empty(1, device="cuda")
    torch.cuda.synchronize()
    out = {}
    # The libraries are imported before the clock starts: their import
    # time (seconds for transformers, and varying) is not the load's.
    if a.what == "load_file":
        from safetensors.torch import load_file
    elif a.what == "hf":
        from transformers import AutoModelForCausalLM
    t0 = time.perf_counter()
    if a.what == "load_file":
        res = load_file(a.path, device="cuda")
        torch.cuda.synchronize()
        out["seconds"] = time.perf_counter() - t0
        out["checksum"] = checksum(res)
    elif a.what == "torch_load":
        res = torch.load(a.path, map_location="cuda", weights_only=True)
        torch.cuda.synchronize()
        out["seconds"] = time.perf_counter() - t0
        out["checksum"] = checksum(res)
    elif a.what == "hf":
        model = AutoModelForCausalLM.from_pretrained(a.path, device_map="cuda", torch_dtype=torch.bfloat16)
        torch.cuda.synchronize()
        out["seconds"] = time.perf_counter() - t0
        out["checksum"] = checksum(model.state_dict())
        out["logits"] = logits_digest(model)
    a_mod = sys.modules.get("gdsfs.autoload")
    out["served"] = a_mod.served() if a_mod else {}
    out["fallbacks"] = a_mod.fallbacks() if a_mod else {}
    print(json.dumps(out))


def check(a):
    """Under gdsfs run: patched calls vs the libraries' own, on CUDA."""
    import torch
    import safetensors
    import safetensors.torch as stt
    from gdsfs.autoload import _serve

    def desc(t):
        return (str(t.dtype), tuple(t.shape), tuple(t.stride()), str(t.device))

    def same(g, w):
        """dtype, shape, strides, device and every byte alike; the bytes
        are compared on the device (hashing them on the CPU took most of
        the bench's time)."""
        if isinstance(g, Exception) or isinstance(w, Exception):
            return type(g) is type(w)
        if desc(g) != desc(w):
            return False
        if not g.numel():
            return True
        u = lambda t: t.detach().contiguous().reshape(-1).view(torch.uint8)  # noqa: E731
        return torch.equal(u(g), u(w))

    def show(x):
        return repr(x) if isinstance(x, Exception) else desc(x)

    def slice_or_error(f, k, key):
        try:
            return f.get_slice(k)[key]
        except Exception as e:
            return e

    bad, n = [], 0
    calls = {"safetensors.torch.load_file": 0, "safetensors.safe_open": 0, "torch.load": 0}
    for p in a.files:
        if p.endswith(".safetensors"):
            calls["safetensors.torch.load_file"] += 1
            calls["safetensors.safe_open"] += 1
            got = stt.load_file(p, device="cuda")
            with _serve.bypass():
                want = stt.load_file._gdsfs_original(p, device="cuda")
            for k in want:
                n += 1
                if not same(got[k], want[k]):
                    bad.append("%s load_file %s: %s != %s" % (p, k, show(got[k]), show(want[k])))
            with safetensors.safe_open(p, framework="pt", device="cuda") as f, _serve.bypass():
                o = safetensors.safe_open._gdsfs_original(p, framework="pt", device="cuda")
                for k in o.keys():
                    shape = o.get_slice(k).get_shape()
                    keys = [slice(None)] + ([slice(1, None)] if shape and shape[0] > 1 else [])
                    keys += [(slice(None), slice(0, 2))] if len(shape) > 1 and shape[1] > 2 else []
                    for key in keys:
                        n += 1
                        w, g = slice_or_error(o, k, key), slice_or_error(f, k, key)
                        if not same(g, w):
                            bad.append("%s get_slice %s[%r]: %s != %s" % (p, k, key, show(g), show(w)))
        elif p.endswith(".pt"):
            calls["torch.load"] += 1
            got = torch.load(p, map_location="cuda", weights_only=True)
            with _serve.bypass():
                want = torch.load._gdsfs_original(p, map_location="cuda", weights_only=True)
            for k in want:
                n += 1
                if not same(got[k], want[k]):
                    bad.append("%s torch.load %s: %s != %s" % (p, k, show(got[k]), show(want[k])))
    from gdsfs import autoload

    print(json.dumps({"compared": n, "mismatches": bad, "calls": calls, "served": autoload.served(),
                      "fallbacks": autoload.fallbacks(), "torch": torch.__version__,
                      "safetensors": safetensors.__version__}))


# ---- the driver -------------------------------------------------------------

class Bench(MountBench):
    def __init__(self, a):
        self.a = a
        self.work = a.work
        self.src = os.path.join(self.work, "src")
        self.mnt = os.path.join(self.work, "mnt")
        self.results = {"cases": {}, "checks": {}}
        self.t0 = time.time()

    def prepare(self):
        """The work directory: SOURCE (src, where make_files writes) and the
        mount point. Made before anything is written there; a work
        directory left by an earlier run is reused (its files are kept)."""
        own_work_dir(self.work)
        for d in (self.work, self.src, self.mnt):
            os.makedirs(d, exist_ok=True)

    def make_files(self):
        import torch

        if self.a.dry_run:  # the torch.save file only, small, on the CPU
            pt = os.path.join(self.src, "state-dry.pt")
            if not os.path.exists(pt):
                g = torch.Generator().manual_seed(2)
                torch.save({"w%02d" % i: torch.randn(256, 256, generator=g).to(torch.bfloat16) for i in range(8)}, pt)
            self.results["files"] = {"torch_save_bytes": os.path.getsize(pt)}
            return None, pt, None
        st = os.path.join(self.src, "big.safetensors")
        if not os.path.exists(st):
            from safetensors.torch import save_file

            n = self.a.size_gib * 16  # 64 MiB bf16 tensors
            g = torch.Generator(device="cuda").manual_seed(1)
            save_file({"layer.%03d.weight" % i: torch.randn(8192, 4096, device="cuda", generator=g,
                                                           dtype=torch.bfloat16).cpu() for i in range(n)}, st)
        pt = os.path.join(self.src, "state.pt")
        if not os.path.exists(pt):
            g = torch.Generator().manual_seed(2)
            torch.save({"w%02d" % i: torch.randn(4096, 4096, generator=g).to(torch.bfloat16) for i in range(32)}, pt)
        hf = os.path.join(self.src, "model")
        if not os.path.exists(os.path.join(hf, "config.json")):
            from transformers import LlamaConfig, LlamaForCausalLM

            cfg = LlamaConfig(hidden_size=2048, intermediate_size=5504, num_hidden_layers=20, num_attention_heads=16,
                              num_key_value_heads=16, vocab_size=32000, torch_dtype="bfloat16")
            torch.manual_seed(3)
            with torch.device("cuda"):
                model = LlamaForCausalLM(cfg).to(torch.bfloat16)
            model.save_pretrained(hf, safe_serialization=True)
            del model
        size = sum(os.path.getsize(os.path.join(hf, f)) for f in os.listdir(hf) if f.endswith(".safetensors"))
        self.results["files"] = {"safetensors_bytes": os.path.getsize(st), "torch_save_bytes": os.path.getsize(pt),
                                 "hf_model_bytes": size}
        return st, pt, hf

    def rels(self, path):
        rel = os.path.relpath(path, self.src)
        if os.path.isdir(path):
            return [os.path.join(rel, f) for f in sorted(os.listdir(path))]
        return [rel]

    def drop_cache(self):
        try:
            sh(["sync"])
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3\n")
            return True
        except OSError:
            return False

    def evict(self, path):
        """Evicts path's files; each must then be absent from .gdsfs/cache
        (ENOENT from evict: it was not staged)."""
        for rel in self.rels(path):
            try:
                with open(os.path.join(self.mnt, ".gdsfs", "evict"), "w") as f:
                    f.write(rel + "\n")
            except FileNotFoundError:
                pass
            except OSError as e:
                raise SystemExit("evict %s: %s" % (rel, e))
            with open(os.path.join(self.mnt, ".gdsfs", "cache")) as f:
                left = [line.rstrip("\n") for line in f if line.split("\t")[0] == rel]
            if left:
                raise SystemExit("evict %s: still in .gdsfs/cache afterwards: %s" % (rel, left))

    def stage(self, path):
        paths = [os.path.join(self.mnt, r) for r in self.rels(path) if not r.endswith(".json")]
        sh([self.a.bin, "warmup", "--wait"] + paths, stdout=subprocess.DEVNULL)

    def one(self, what, path, wrap):
        cmd = ([self.a.bin, "run", "--"] if wrap else []) + [sys.executable, HERE, "measure", "--what", what, "--path", path]
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, check=False)
        if r.returncode:
            raise SystemExit("%s failed:\n%s" % (cmd, r.stderr.decode(errors="replace")[-3000:]))
        return json.loads(r.stdout.decode().strip().splitlines()[-1])

    def cases(self, what, src_path, cases):
        """Runs each of cases (name, where, wrap, prep) --repeat times,
        interleaved: round i runs them all once, starting at case i, so a
        machine that drifts during the run (page cache, clocks, a noisy
        start) weighs on every case alike rather than on the block that
        ran last. The median of each case's runs is its figure."""
        if self.a.cases:
            cases = [c for c in cases if re.search(self.a.cases, c[0])]
        if not cases:
            return
        runs, skipped = {c[0]: [] for c in cases}, {}
        for i in range(self.a.repeat):
            k = i % len(cases)
            for name, where, wrap, prep in cases[k:] + cases[:k]:
                if name in skipped:
                    continue
                path = src_path if where == "src" else os.path.join(self.mnt, os.path.relpath(src_path, self.src))
                if prep(src_path) is False:
                    skipped[name] = {"skipped": "page cache could not be dropped"}
                    continue
                r = self.one(what, path, wrap)
                runs[name].append(r)
                print("%-40s %8.3f s  (round %d, at %.0f s)" % (name, r["seconds"], i + 1, time.time() - self.t0),
                      file=sys.stderr)
        for name, _, _, _ in cases:
            if name in skipped:
                self.results["cases"][name] = skipped[name]
                continue
            secs = [r["seconds"] for r in runs[name]]
            r = dict(runs[name][-1], seconds=statistics.median(secs), runs=secs)
            self.results["cases"][name] = r
            print("%-40s %8.3f s  median; served=%s fallbacks=%s" % (name, r["seconds"], r.get("served"),
                                                                   r.get("fallbacks")), file=sys.stderr)

    def loaders(self, st, pt, hf):
        def warm(p):
            self.quiesce(p)
            self.warm_cache(p)

        def resident(p):
            self.warm_cache(p)
            self.stage(p)

        def cold(p):
            self.quiesce(p)
            return self.drop_cache()

        for what, p in (("load_file", st), ("hf", hf), ("torch_load", pt)):
            cs = [(what + " plain SOURCE warm", "src", False, warm),
                  (what + " plain mount warm", "mnt", False, warm),
                  (what + " run resident", "mnt", True, resident),
                  (what + " run not staged warm", "mnt", True, warm)]
            if what != "torch_load":
                cs += [(what + " plain SOURCE cold", "src", False, cold),
                       (what + " plain mount cold", "mnt", False, cold),
                       (what + " run not staged cold", "mnt", True, cold)]
            self.cases(what, p, cs)

    def quiesce(self, p):
        """No staging of p left running, and p not staged: a plain load
        through the mount ends with a close, after which the daemon stages
        the file (deferred while it is read). Left running, that staging
        reads the disk and crosses PCIe during the next measurement (an
        earlier run measured plain mount cold at twice SOURCE's time this
        way), so every case waits for it (warmup joins it) and evicts."""
        self.stage(p)
        self.evict(p)

    def checks(self, st, pt, hf):
        fixtures = os.path.join(os.path.dirname(HERE), "..", "python", "tests", "fixtures", "safetensors")
        files = []
        if os.path.isdir(fixtures):
            dst = os.path.join(self.src, "fixtures")
            os.makedirs(dst, exist_ok=True)
            for f in sorted(os.listdir(fixtures)):
                if f.endswith(".safetensors"):
                    with open(os.path.join(fixtures, f), "rb") as i, open(os.path.join(dst, f), "wb") as o:
                        o.write(i.read())
                    files.append(os.path.join(self.mnt, "fixtures", f))
        files += [os.path.join(self.mnt, os.path.relpath(p, self.src)) for p in (st, pt)]
        files += [os.path.join(self.mnt, "model", f) for f in sorted(os.listdir(hf)) if f.endswith(".safetensors")]
        r = subprocess.run([self.a.bin, "run", "--", sys.executable, HERE, "check"] + files,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        if r.returncode:
            self.results["checks"] = {"error": r.stderr.decode(errors="replace")[-3000:]}
        else:
            self.results["checks"] = json.loads(r.stdout.decode().strip().splitlines()[-1])

    def verdicts(self):
        c = self.results["cases"]
        s = lambda k: c.get(k, {}).get("seconds")  # noqa: E731
        v = {}
        for what in ("load_file", "hf", "torch_load"):
            base, mnt = s(what + " plain SOURCE warm"), s(what + " plain mount warm")
            res, nsw = s(what + " run resident"), s(what + " run not staged warm")
            if base and res:
                v[what + " resident speed-up"] = round(base / res, 1)
            if base and nsw:
                v[what + " not staged (warm) vs plain"] = round(base / nsw, 2)
            if base and mnt:
                v[what + " plain mount / SOURCE (speed)"] = round(base / mnt, 3)
            cold, ncold = s(what + " plain SOURCE cold"), s(what + " run not staged cold")
            if cold and ncold:
                v[what + " not staged (cold) vs plain cold"] = round(cold / ncold, 2)
            cmnt = s(what + " plain mount cold")
            if cold and cmnt:
                v[what + " plain mount / SOURCE cold (speed)"] = round(cold / cmnt, 3)
            # Alike across the cases run (at least two of them to compare).
            ran = [c[k] for k in c if k.startswith(what + " ") and "checksum" in c[k]]
            if len(ran) > 1:
                v[what + " identical checksums"] = len({r["checksum"] for r in ran}) == 1
                if what == "hf":
                    v["hf identical logits"] = len({r.get("logits") for r in ran}) == 1

        def at_least(key, bound, *cases):
            """None: not measured in this run (--cases); "not checked: WHY":
            one of its cases was asked for but could not run as asked."""
            why = [c[n]["skipped"] for n in cases if "skipped" in c.get(n, {})]
            if why:
                return "not checked: " + why[0]
            return None if v.get(key) is None else v[key] >= bound

        ck = self.results["checks"]
        calls = ck.get("calls") or {}
        served = ck.get("served") or {}
        if "error" in ck:
            checked = "not checked: " + ck["error"].strip().splitlines()[-1][:200] if ck["error"].strip() else "not checked: check failed"
        elif not calls or ck.get("compared", 0) == 0:
            checked = "not checked: nothing compared"
        else:
            checked = not ck.get("mismatches") and all(served.get(k, 0) == n for k, n in calls.items())
            v["checked calls served"] = {k: "%d of %d" % (served.get(k, 0), n) for k, n in calls.items()}

        hf = v.get("hf identical checksums")  # None: fewer than two hf cases run
        sums = [v[k] for k in ("load_file identical checksums", "torch_load identical checksums") if k in v]
        v["targets"] = {
            "load_file resident >= 20x": at_least("load_file resident speed-up", 20),
            "load_file not staged (warm) not slower": at_least("load_file not staged (warm) vs plain", 1.0),
            "load_file not staged (cold) not slower": at_least("load_file not staged (cold) vs plain cold", 1.0,
                                                               "load_file plain SOURCE cold", "load_file run not staged cold"),
            "load_file plain mount >= 0.95 SOURCE": at_least("load_file plain mount / SOURCE (speed)", 0.95),
            "load_file plain mount cold >= 0.95 SOURCE": at_least("load_file plain mount / SOURCE cold (speed)", 0.95,
                                                                  "load_file plain SOURCE cold", "load_file plain mount cold"),
            "hf plain mount >= 0.95 SOURCE": at_least("hf plain mount / SOURCE (speed)", 0.95),
            "hf plain mount cold >= 0.95 SOURCE": at_least("hf plain mount / SOURCE cold (speed)", 0.95,
                                                           "hf plain SOURCE cold", "hf plain mount cold"),
            "hf identical checksums and logits": None if hf is None else bool(hf and v.get("hf identical logits")),
            "load_file and torch_load identical checksums": all(sums) if sums else None,
            "no mismatches against the libraries, every checked call served": checked,
        }
        self.results["verdicts"] = v

    def status(self):
        """The exit status: 1 where a measured target failed or one could
        not be checked; one not measured (its cases left out by --cases)
        fails nothing."""
        return 1 if any(ok is False or isinstance(ok, str) for ok in self.results["verdicts"]["targets"].values()) else 0

    def table(self):
        rows = ["| case | seconds (median) | GB/s | served / fallbacks |", "|---|---|---|---|"]
        sizes = {"load_file": self.results["files"]["safetensors_bytes"], "hf": self.results["files"]["hf_model_bytes"],
                 "torch_load": self.results["files"]["torch_save_bytes"]}
        for k, r in self.results["cases"].items():
            if "seconds" not in r:
                rows.append("| %s | %s | | |" % (k, r.get("skipped")))
                continue
            gbs = sizes[k.split(" ")[0]] / r["seconds"] / 1e9
            rows.append("| %s | %.3f | %.2f | %s / %s |" % (k, r["seconds"], gbs, r.get("served") or "-",
                                                             r.get("fallbacks") or "-"))
        rows.append("")
        rows += ["| figure | value |", "|---|---|"]
        for k, val in self.results["verdicts"].items():
            if k != "targets":
                rows.append("| %s | %s |" % (k, val))
        for k, ok in self.results["verdicts"]["targets"].items():
            rows.append("| target: %s | %s |" % (k, ok if isinstance(ok, str) else
                                                 {True: "PASS", False: "FAIL", None: "not measured (--cases)"}[ok]))
        return "\n".join(rows)


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(8 << 20)
            if not b:
                return h.hexdigest()
            h.update(b)


def dry_run(b, pt):
    """The host's run: pt staged through warmup, its bytes through the
    mount against SOURCE's."""
    b.stage(pt)
    same = sha256(os.path.join(b.mnt, os.path.relpath(pt, b.src))) == sha256(pt)
    b.results["dry_run"] = {"staged": os.path.relpath(pt, b.src), "bytes_through_mount_equal": same}
    print(json.dumps(b.results, indent=1))
    print("autoload dry run (host backend): work %s; %s staged by warmup; bytes through the mount %s SOURCE's; nothing timed"
          % (b.work, os.path.relpath(pt, b.src), "equal" if same else "DIFFER FROM"))
    return 0 if same else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="mode")
    m = sub.add_parser("measure")
    m.add_argument("--what", required=True)
    m.add_argument("--path", required=True)
    c = sub.add_parser("check")
    c.add_argument("files", nargs="*")
    ap.add_argument("--bin", default=os.path.join(os.path.dirname(HERE), "..", ".bin", "gdsfs"))
    ap.add_argument("--work", default="/tmp/gdsfs-autoload")
    ap.add_argument("--size-gib", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                    help="a config.yaml key for the mount (repeatable; gdsfs bench autoload passes its --set here)")
    ap.add_argument("--cases", default="", help="only the cases whose name this regular expression finds (default: all)")
    ap.add_argument("--dry-run", action="store_true", help="no GPU: the work directory, a small torch.save file, mount, warmup")
    a = ap.parse_args()
    if a.mode == "measure":
        return measure(a)
    if a.mode == "check":
        return check(a)
    a.bin = os.path.abspath(a.bin)
    b = Bench(a)
    b.prepare()
    st, pt, hf = b.make_files()
    b.mount()
    try:
        if a.dry_run:
            return dry_run(b, pt)
        b.checks(st, pt, hf)
        b.loaders(st, pt, hf)
    finally:
        b.umount()
    b.verdicts()
    b.results["versions"] = versions("safetensors", "transformers")
    print(json.dumps(b.results, indent=1))
    print()
    print(b.table())
    return b.status()


if __name__ == "__main__":
    sys.exit(main())
