#!/usr/bin/env python3
"""Train a tiny model with a PyTorch DataLoader over shards read through a
gdsfs mount.

    # 1. write demo shards into the SOURCE directory of the mount
    python3 examples/dataloader.py --make-shards SOURCE/shards
    # 2. mount (elsewhere: gdsfs mount SOURCE MOUNT) and train from the mount
    python3 examples/dataloader.py MOUNT/shards --epochs 3

A shard is a file of float32 records [x_0 .. x_{D-1}, y], D+1 values each
(--dim D). The Dataset's __getitem__ returns one whole shard as a
(records, D+1) tensor:

  --source lease   gdsfs.load(shard): a zero-copy tensor over the staged
                   bytes (a CUDA tensor on a GPU-staged mount, a read-only
                   CPU tensor on the host backend). The lease lives as long
                   as the tensor; the DataLoader runs in the main process
                   (num_workers=0), since CUDA tensors over imported memory
                   cannot travel between processes.
  --source read    the shard's bytes read with open() through the mount
                   (worker processes allowed: --workers N).
  --source auto    lease when a CUDA device is usable, else read (default).

The loop fits a linear model y = x.w + b with SGD in minibatches sliced from
each shard, and prints the loss per epoch. It exits non-zero if the loss
did not drop. Requirements: torch (any recent version); gdsfs from
python/ (found automatically).
"""

import argparse
import glob
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

import gdsfs  # noqa: E402


def make_shards(out_dir, shards, records, dim, seed):
    """Write demo shards: y = x.w_true + 0.5 + noise."""
    import torch

    g = torch.Generator().manual_seed(seed)
    w = torch.randn(dim, generator=g)
    os.makedirs(out_dir, exist_ok=True)
    for i in range(shards):
        x = torch.randn(records, dim, generator=g)
        y = x @ w + 0.5 + 0.01 * torch.randn(records, generator=g)
        rec = torch.cat([x, y[:, None]], dim=1).contiguous()
        path = os.path.join(out_dir, "shard-%05d.bin" % i)
        with open(path, "wb") as f:
            f.write(rec.numpy().tobytes() if _has_numpy() else _tensor_bytes(rec))
    with open(os.path.join(out_dir, "meta.json"), "w") as f:
        json.dump({"dim": dim, "records": records, "shards": shards, "w_true": w.tolist()}, f)
    print("wrote %d shards of %d records (dim %d) to %s" % (shards, records, dim, out_dir))


def _has_numpy():
    try:
        import numpy  # noqa: F401
    except ImportError:
        return False
    return True


def _tensor_bytes(t):
    import torch

    return bytes(t.reshape(-1).view(torch.uint8).tolist())


def build_dataset(files, dim, source):
    import torch

    class ShardDataset(torch.utils.data.Dataset):
        def __len__(self):
            return len(files)

        def __getitem__(self, i):
            if source == "lease":
                t = gdsfs.load(files[i], torch.float32)  # zero-copy
            else:
                with open(files[i], "rb") as f:
                    t = torch.frombuffer(bytearray(f.read()), dtype=torch.float32)
            return t.view(-1, dim + 1)

    return ShardDataset()


def leases_active(path):
    """leases_active of the mount holding path, if it is a gdsfs mount."""
    try:
        _, _, mnt = gdsfs.locate(path)
        with open(os.path.join(mnt, ".gdsfs", "stats.json")) as f:
            return json.load(f).get("leases_active")
    except (OSError, ValueError, TypeError):
        return None


def train(args):
    import torch

    files = sorted(glob.glob(os.path.join(args.data, "*.bin")))
    if not files:
        print("no *.bin shards in %s (make some with --make-shards)" % args.data, file=sys.stderr)
        return 2
    dim = args.dim
    meta = os.path.join(args.data, "meta.json")
    if os.path.exists(meta):
        with open(meta) as f:
            dim = json.load(f)["dim"]
    source = args.source
    if source == "auto":
        source = "lease" if torch.cuda.is_available() else "read"
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    workers = 0 if source == "lease" else args.workers
    torch.manual_seed(args.seed)
    loader = torch.utils.data.DataLoader(build_dataset(files, dim, source), batch_size=None,
                                         shuffle=True, num_workers=workers)
    model = torch.nn.Linear(dim, 1).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    print("%d shards, dim %d, source=%s, device=%s, workers=%d" % (len(files), dim, source, device, workers))
    def fit(shard):
        """SGD over one shard's minibatches; returns (sum of losses, records).
        Its locals (views of the shard) die when it returns, so the shard's
        lease can end as soon as the loop drops the shard."""
        total = 0.0
        for mb in shard.split(args.batch):
            x, y = mb[:, :dim], mb[:, dim:]
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item() * len(mb)
        return total, len(shard)

    losses = []
    for epoch in range(args.epochs):
        t0 = time.monotonic()
        total, n = 0.0, 0
        for shard in loader:
            # No copy for a GPU lease (already there); host tensors move.
            s, k = fit(shard.to(device, non_blocking=True))
            total, n = total + s, n + k
        del shard  # a lease ends when its shard tensor is gone
        losses.append(total / max(n, 1))
        print("epoch %d: loss %.6f (%d records, %.2fs)" % (epoch, losses[-1], n, time.monotonic() - t0))
    del loader
    active = leases_active(files[0])
    if active is not None:
        print("leases active on the mount after training: %d" % active)
    print("final loss %.6f (first epoch %.6f)" % (losses[-1], losses[0]))
    if len(losses) > 1 and not losses[-1] < losses[0]:
        print("loss did not decrease", file=sys.stderr)
        return 1
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("data", nargs="?", help="directory of *.bin shards under a gdsfs mount")
    ap.add_argument("--make-shards", metavar="DIR", help="write demo shards to DIR (the mount's SOURCE) and exit")
    ap.add_argument("--shards", type=int, default=8, help="demo shards to write (default 8)")
    ap.add_argument("--records", type=int, default=4096, help="records per demo shard (default 4096)")
    ap.add_argument("--dim", type=int, default=16, help="features per record (default 16; meta.json wins)")
    ap.add_argument("--source", choices=("auto", "lease", "read"), default="auto")
    ap.add_argument("--workers", type=int, default=0, help="DataLoader workers for --source read")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.make_shards:
        make_shards(args.make_shards, args.shards, args.records, args.dim, args.seed)
        return 0
    if not args.data:
        ap.error("give a shard directory, or --make-shards DIR")
    return train(args)


if __name__ == "__main__":
    sys.exit(main())
