#!/usr/bin/env python3
"""Host-backend stand-ins for scripts/frameworks-gpu.py's DataLoader and
vLLM-style cases: the time per move (us), plain vs served, in 7
interleaved rounds, the least of each kept. Moves into CPU memory stand in
for moves to a GPU (as in python/tests/test_autoload_moves.py); plain is
the same process with CPU targets not served. Needs bin/gdsfs.

Usage: /usr/bin/python3 scripts/autoload-host-moves.py [ROOT]
(ROOT: the checkout whose python/ package and bin/gdsfs run; default this
one)."""
import gc, json, os, struct, sys, time
ROOT = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "python"), os.path.join(ROOT, "python", "tests")]
os.environ.setdefault("GDSFS_BIN", os.path.join(ROOT, "bin", "gdsfs"))
import numpy as np, torch
import gdsfs.autoload as A
from gdsfs.autoload import _moves
from _support import Mount

_moves.TARGETS = ("cuda", "cpu")
torch.set_num_threads(1)
m = Mount(device="host")
try:
    NS, SH = 16, 1 << 20           # 16 shards of 1 MiB
    for i in range(NS):
        np.save(os.path.join(m.src, "s%02d.npy" % i), np.full(SH // 4, i, dtype=np.float32))
    # a safetensors-shaped file: 64 tensors of 128x128 f32 (4 MiB)
    NT = 64
    head, blobs, off = {}, [], 0
    for i in range(NT):
        b = np.random.default_rng(i).standard_normal((128, 128)).astype(np.float32).tobytes()
        head["w%d" % i] = {"dtype": "F32", "shape": [128, 128], "data_offsets": [off, off + len(b)]}
        blobs.append(b); off += len(b)
    h = json.dumps(head).encode(); h += b" " * (-len(h) % 8)
    with open(os.path.join(m.src, "m.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))

    class DS(torch.utils.data.Dataset):
        def __len__(self): return NS
        def __getitem__(self, i): return torch.from_numpy(np.load(m.path("s%02d.npy" % i), mmap_mode="r"))

    def dataloader():
        n = 0
        for b in torch.utils.data.DataLoader(DS(), batch_size=None, num_workers=0):
            n += float(b.to("cpu", copy=True)[0])
        return NS

    params = [torch.empty(64, 128) for _ in range(NT)]
    def vllm():
        p = m.path("m.safetensors")
        st = torch.ByteStorage.from_file(p, False, os.path.getsize(p))  # as safe_open(framework="pt") maps it
        whole = torch.empty(0, dtype=torch.uint8).set_(st.untyped())
        with open(p, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8)); hd = json.loads(f.read(n))
        for i, (k, e) in enumerate(hd.items()):
            b, en = e["data_offsets"]
            w = whole[8 + n + b:8 + n + en].view(torch.float32).view(128, 128)
            params[i].copy_(w.narrow(0, 0, 64))  # rank 0 of 2
        return NT

    best = {}
    for r in range(7):
        for case, fn in (("dataloader", dataloader), ("vllm", vllm)):
            for mode in ("plain", "served"):
                _moves.TARGETS = ("cuda",) if mode == "plain" else ("cuda", "cpu")
                gc.collect()
                t0 = time.perf_counter(); n = fn(); dt = time.perf_counter() - t0
                us = dt / n * 1e6
                k = (case, mode)
                best[k] = min(best.get(k, 1e18), us)
    print("served:", A.served(), "fallbacks:", A.fallbacks())
    for case in ("dataloader", "vllm"):
        p, s = best[(case, "plain")], best[(case, "served")]
        print("%-10s plain %8.1f us/move  served %8.1f us/move  ratio %.2fx" % (case, p, s, p / s))
finally:
    A.disable(); _moves.release(); m.stop()
