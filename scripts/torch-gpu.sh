#!/bin/sh
# Torch consumers on a GPU machine: leases of a staged 1 GiB and 4 GiB file
# give zero-copy tensors (data_ptr is the lease's pointer) whose SHA-256
# equals the file's; four consumer processes at once do the same.
# Uses the files gpustaging.test wrote in $GDSFS_TEST_DIR.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
src="$GDSFS_TEST_DIR"
mnt="$GDSFS_TEST_DIR.mnt"
mkdir -p "$mnt"
for f in gpu-1073741824.bin gpu-4294967296.bin; do
	[ -f "$src/$f" ] || { echo "missing $src/$f (run gpustaging.test first)"; exit 1; }
done
"$here/gdsfs" mount --set staging.device=cuda --set log.format=console \
	--set ipc.socket="$GDSFS_TEST_DIR.run/s.sock" "$src" "$mnt" 2> "$GDSFS_TEST_DIR.log" &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; tail -3 "$GDSFS_TEST_DIR.log"' EXIT
for _ in $(seq 100); do [ -e "$mnt/.gdsfs/version" ] && break; sleep 0.1; done
cat > "$GDSFS_TEST_DIR.py" <<'PY'
import hashlib, sys, torch, gdsfs
def sha_file(p):
    h = hashlib.sha256()
    with open(p, "rb") as f:
        while True:
            b = f.read(64 << 20)
            if not b:
                return h.hexdigest()
            h.update(b)
mnt, src, names = sys.argv[1], sys.argv[2], sys.argv[3:]
for name in names:
    with gdsfs.open(mnt + "/" + name) as lease:
        t = lease.tensor()
        assert t.is_cuda and t.data_ptr() == lease.ptr, "not zero-copy"
        h = hashlib.sha256()
        for part in t.split(256 << 20):
            h.update(part.cpu().numpy().tobytes())
        got, want = h.hexdigest(), sha_file(src + "/" + name)
        print(name, lease.size, lease.device, "sha256 match" if got == want else "SHA256 MISMATCH", flush=True)
        assert got == want
        del t
PY
export PYTHONPATH="$repo/python"
python3 "$GDSFS_TEST_DIR.py" "$mnt" "$src" gpu-1073741824.bin gpu-4294967296.bin
echo "four consumers at once:"
pids=""
for i in 1 2 3 4; do
	python3 "$GDSFS_TEST_DIR.py" "$mnt" "$src" gpu-1073741824.bin & pids="$pids $!"
done
for p in $pids; do wait $p; done
grep -E "leases|bytes_(posix|cufile)" "$mnt/.gdsfs/stats"
