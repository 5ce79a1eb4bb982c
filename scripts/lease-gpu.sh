#!/bin/sh
# Leases on a GPU machine, from the bundle `make gpu-bundle` puts in .bin/:
#   1. the Go client, built with CGO_ENABLED=0 (leasecheck), maps staged files
#      on the GPU and their SHA-256 matches the files (1 MiB, 32 MiB, 1 GiB),
#      alone and as one batch (OpenMany), read-only for shared leases;
#   2. a consumer writing into a shared-mode lease faults in that process
#      only: the daemon, another consumer holding the file, and the next
#      lease all still have the file's bytes;
#   3. private mode: a write into a lease stays in that lease;
#   4. repeat-lease latency, Go and Python (the fast path: one round trip,
#      no descriptors), and the first lease of a resident file in a process;
#   5. descriptors and mappings of 2,000 lease cycles on the GPU.
# Prints PASS/FAIL per check (test-gpu.sh counts the PASS lines) and
# "LEASE GPU CHECKS PASSED" at the end.
#
# Environment: GDSFS_TEST_DIR (a directory on a disk filesystem, default
# /var/tmp/gdsfs-gpu). For a dry run of the script itself on a machine
# without a GPU: GDSFS_LEASE_DEVICE=host GDSFS_LEASE_SMALL=1 (the GPU checks
# then fail, the others run).
set -eu
device="${GDSFS_LEASE_DEVICE:-cuda}"
big=1024 shards=63
if [ "${GDSFS_LEASE_SMALL:-0}" = 1 ]; then big=64 shards=7; fi
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
GDSFS_TEST_DIR="${GDSFS_TEST_DIR:-/var/tmp/gdsfs-gpu}"
mkdir -p -m 700 "$GDSFS_TEST_DIR"
if [ -L "$GDSFS_TEST_DIR" ] || [ ! -O "$GDSFS_TEST_DIR" ] || [ -n "$(find "$GDSFS_TEST_DIR" -maxdepth 0 -perm /022)" ]; then
	echo "GDSFS_TEST_DIR=$GDSFS_TEST_DIR: not a directory of yours that only you may write (files are written and run there)" >&2
	exit 1
fi
base="$GDSFS_TEST_DIR/lease"
src="$base/src"
mnt="$base/mnt"
export PYTHONPATH="$repo/python"
fail=0
check() { # check NAME CONDITION-COMMAND...
	name=$1
	shift
	if "$@"; then echo "PASS  $name"; else echo "FAIL  $name"; fail=1; fi
}

mkdir -p "$src/shards" "$mnt"
for spec in 1m:1 32m:32 1g:$big; do
	name=${spec%%:*} mib=${spec#*:}
	[ -s "$src/$name.bin" ] || head -c $((mib << 20)) /dev/urandom > "$src/$name.bin"
done
for i in $(seq -w 0 $shards); do
	[ -s "$src/shards/s$i.bin" ] || head -c $((32 << 20)) /dev/urandom > "$src/shards/s$i.bin"
done

daemon=""
start_mount() { # start_mount SHARING
	"$here/gdsfs" mount --set staging.device="$device" --set log.format=console --set staging.capacity=8GiB \
		--set ipc.sharing="$1" --set ipc.socket="$base.sock" "$src" "$mnt" 2> "$base.$1.log" &
	daemon=$!
	for _ in $(seq 200); do [ -e "$mnt/.gdsfs/version" ] && return 0; sleep 0.1; done
	echo "mount did not come up:"; tail -20 "$base.$1.log"; exit 1
}
stop_mount() {
	kill "$daemon" 2>/dev/null || true
	wait "$daemon" 2>/dev/null || true
}
trap stop_mount EXIT

echo "=== 1. Go client without cgo"
# The build settings are in the binary (what `go version -m` prints). A
# CGO_ENABLED=0 binary still links libc dynamically: purego loads
# libcuda.so.1 with the system's dlopen.
check "leasecheck was built with CGO_ENABLED=0" grep -a -q "CGO_ENABLED=0" "$here/leasecheck"
start_mount shared
for f in 1m 32m 1g; do
	out=$("$here/leasecheck" "$mnt/$f.bin") || { echo "$out"; echo "FAIL  Go lease of $f.bin"; fail=1; continue; }
	echo "$out"
	want=$(sha256sum "$src/$f.bin" | cut -d' ' -f1)
	check "Go lease of $f.bin: sha256 matches the file" sh -c "echo '$out' | grep -q '\"sha256\":\"$want\"'"
	check "Go lease of $f.bin: on the GPU ($device), read-only" sh -c "echo '$out' | grep -q '\"device\":\"GPU-.*\"readonly\":true'"
done
out=$("$here/leasecheck" -many "$mnt/1m.bin" "$mnt/32m.bin" "$mnt/1g.bin") || { echo "FAIL  Go OpenMany exited non-zero"; fail=1; }
echo "$out"
check "Go OpenMany of three files: one line each, each sha256 the file's" python3 -c "
import json, sys
got = {}
for line in sys.argv[1].splitlines():
    r = json.loads(line)
    got[r['path']] = r['sha256']
want = dict(zip(sys.argv[2::2], sys.argv[3::2]))
sys.exit(got != want)" "$out" \
	"$mnt/1m.bin" "$(sha256sum "$src/1m.bin" | cut -d' ' -f1)" \
	"$mnt/32m.bin" "$(sha256sum "$src/32m.bin" | cut -d' ' -f1)" \
	"$mnt/1g.bin" "$(sha256sum "$src/1g.bin" | cut -d' ' -f1)"

echo "=== 2. a write into a shared lease faults in that process only"
# Another consumer holds the same file throughout: it hashes its lease's
# bytes when it holds it and again once its stdin closes, after the write.
cat > "$base.holder.py" <<'PY'
import hashlib, sys, gdsfs
with gdsfs.open(sys.argv[1]) as l:
    t = l.tensor()
    print("held", hashlib.sha256(t.cpu().numpy().tobytes()).hexdigest(), flush=True)
    sys.stdin.read()
    print("after", hashlib.sha256(t.cpu().numpy().tobytes()).hexdigest(), flush=True)
PY
rm -f "$base.hold.in" "$base.hold.out"
mkfifo "$base.hold.in" "$base.hold.out"
python3 "$base.holder.py" "$mnt/32m.bin" < "$base.hold.in" > "$base.hold.out" 2> "$base.holder.err" &
holder=$!
exec 9> "$base.hold.in" 8< "$base.hold.out"
read -r held_word held_sum <&8 || held_word=""
want=$(sha256sum "$src/32m.bin" | cut -d' ' -f1)
check "the holder's lease has the file's bytes before the write" test "$held_word $held_sum" = "held $want"
cat > "$base.write.py" <<'PY'
import sys, torch, gdsfs
l = gdsfs.open(sys.argv[1])
print("readonly", l.readonly, flush=True)
t = l.tensor()
try:
    t[:4096] = 7
    torch.cuda.synchronize()
    print("WRITTEN", flush=True)
except Exception as e:
    print("faulted:", type(e).__name__, str(e).splitlines()[0], flush=True)
PY
set +e
python3 "$base.write.py" "$mnt/32m.bin" > "$base.write.out" 2>&1
rc=$?
set -e
cat "$base.write.out"
echo "writer exit status $rc"
check "the writer's mapping was read-only" grep -q "readonly True" "$base.write.out"
# The write must fail as a write into a read-only mapping does: on a GPU
# the kernel's illegal memory access, on the host backend SIGSEGV (exit
# 139); any other failure (an import error, out of memory) is not it.
if [ "$device" = host ]; then
	check "the write faulted (SIGSEGV) and did not go through" sh -c "[ $rc = 139 ] && ! grep -q WRITTEN '$base.write.out'"
else
	check "the write faulted (illegal memory access) and did not go through" \
		sh -c "grep -q '^faulted: .*illegal memory access' '$base.write.out' && ! grep -q WRITTEN '$base.write.out'"
fi
check "the daemon is still running" kill -0 "$daemon"
exec 9>&-   # the holder hashes its lease again and exits
read -r after_word after_sum <&8 || after_word=""
exec 8<&-
wait "$holder" || true
cat "$base.holder.err"
check "the holder's lease still has the file's bytes after the write" test "$after_word $after_sum" = "after $want"
cat > "$base.sha.py" <<'PY'
import hashlib, sys, gdsfs
with gdsfs.open(sys.argv[1]) as l:
    t = l.tensor()
    print(hashlib.sha256(t.cpu().numpy().tobytes()).hexdigest())
PY
check "the next lease (Python, a new process) has the file's bytes" test "$(python3 "$base.sha.py" "$mnt/32m.bin")" = "$want"
check "the next lease (Go) has the file's bytes" sh -c "'$here/leasecheck' '$mnt/32m.bin' | grep -q '$want'"
grep -E "^(leases_active|lease_held_bytes|ipc_open_connections) " "$mnt/.gdsfs/stats" || true

echo "=== 4. lease latency (resident files), median of 200"
for f in 1m 32m 1g; do "$here/leasecheck" -bench 200 "$mnt/$f.bin"; done
cat > "$base.bench.py" <<'PY'
import statistics, sys, time, gdsfs
for p in sys.argv[1:]:
    t0 = time.perf_counter(); l = gdsfs.open(p); l.ptr; first = time.perf_counter() - t0; l.close()
    rep, fresh, reused = [], [], 0
    for _ in range(200):
        t0 = time.perf_counter(); l = gdsfs.open(p); l.ptr; rep.append(time.perf_counter() - t0)
        reused += l.reused; l.close()
    for _ in range(30):
        gdsfs.disconnect()
        t0 = time.perf_counter(); l = gdsfs.open(p); l.ptr; fresh.append(time.perf_counter() - t0); l.close()
    ms = lambda v: round(v * 1e3, 3)
    print({"path": p, "python_first_ms": ms(first), "repeat_median_ms": ms(statistics.median(rep)),
           "repeat_p90_ms": ms(sorted(rep)[180]), "reused": reused, "fresh_median_ms": ms(statistics.median(fresh))})
PY
python3 "$base.bench.py" "$mnt/1m.bin" "$mnt/32m.bin" "$mnt/1g.bin"
cat > "$base.epoch.py" <<'PY'
import glob, sys, time, torch, gdsfs, gdsfs.torch
paths = sorted(glob.glob(sys.argv[1] + "/s*.bin"))
for epoch in range(3):
    t0 = time.perf_counter(); n = 0; acc = None
    for t in gdsfs.torch.leased(paths, ahead=16):
        s = t.sum(dtype=torch.int64)  # a kernel reads every byte of the shard
        acc = s if acc is None else acc + s
        n += t.numel()
    acc.item()
    dt = time.perf_counter() - t0
    print("epoch %d: %d shards of 32 MiB, %.1f GB/s through gdsfs.torch.leased (a kernel reads each)" % (epoch, len(paths), n / dt / 1e9))
PY
python3 "$base.epoch.py" "$mnt/shards"

echo "=== 5. 2,000 lease cycles on the GPU: descriptors and mappings"
out=$("$here/leasecheck" -cycles 2000 "$mnt/1m.bin" "$mnt/32m.bin")
echo "$out"
check "the consumer's descriptors are as before" python3 -c "
import json, sys; c = json.loads(sys.argv[1]); k = ('fds', 'memfds', 'sockets', 'memfd_maps')
sys.exit(any(c['before'][x] != c['after'][x] for x in k))" "$out"
stop_mount

echo "=== 3. private mode: a write stays in its own copy"
start_mount private
cat > "$base.private.py" <<'PY'
import hashlib, sys, torch, gdsfs
with gdsfs.open(sys.argv[1]) as a, gdsfs.open(sys.argv[1]) as b:
    assert not a.readonly and a.sharing == "private"
    ta, tb = a.tensor(), b.tensor()
    ta[:4096] = 7
    if ta.is_cuda:
        torch.cuda.synchronize()
    assert ta[:4096].eq(7).all().item(), "the private write did not land"
    print(hashlib.sha256(tb.cpu().numpy().tobytes()).hexdigest())
PY
check "a private write is not seen by another lease" test "$(python3 "$base.private.py" "$mnt/32m.bin")" = "$want"
stop_mount
trap - EXIT

[ $fail = 0 ] && echo "LEASE GPU CHECKS PASSED" || echo "LEASE GPU CHECKS FAILED"
exit $fail
