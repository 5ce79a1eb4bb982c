#!/bin/sh
# cuFile's own statistics against gdsfs's load-path attribution, on a GPU
# machine, after the cuFile compat-mode set-up (cufile-compat.sh DIR from
# the bundle and CUFILE_FORCE_COMPAT_MODE=true; no nvidia-fs, so
# cuFile runs its compat mode: POSIX reads).
# Run from the bundle (make gpu-bundle; .bin/ holds gdsfs, this script and
# cufile-compat.sh):  sh .bin/cufile-stats-gpu.sh [DIR]   (DIR default /var/tmp)
#
#   1. io.compat_mode=off (the cuFile path forced), a 4 GiB file staged with
#      gdsfs warmup --wait: the device's bytes_cufile is the file's size and
#      equals cuFile's read bytes for that GPU, cuFile counted POSIX reads
#      and no nvidia-fs ones, and stats.json's cufile.attribution is ok.
#   2. io.compat_mode=on (gdsfs's POSIX path), another 4 GiB file in a new
#      daemon: bytes_posix grows by its size and cuFile's counters for the
#      GPU do not move.
#   3. gdsfs check --json: cufile_path names the path cuFile counted in 1.
#   Also, where cc and cufile.h are there: shim.h's statistics layout
#   (sizes and offsets) against the real header.
# Prints PASS/FAIL lines with the numbers; exits 1 on any FAIL. Copies of
# stats.json, the daemons' logs and check's JSON go to $OUT (or .).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
base=${1:-/var/tmp}
out=${OUT:-.}
mkdir -p "$out"
work="$base/gdsfs-cufile-stats.$$"
size=4294967296
fail=0
pass() { echo "PASS: $*"; }
failed() {
	echo "FAIL: $*"
	fail=1
}

if [ ! -x "$here/gdsfs" ] || [ ! -f "$here/cufile-compat.sh" ]; then
	echo "FAIL: $here lacks gdsfs or cufile-compat.sh (make gpu-bundle copies shared/device/cufile-compat.sh)"
	exit 1
fi
command -v python3 >/dev/null || {
	echo "FAIL: python3 (reads stats.json) not found"
	exit 1
}
sh "$here/cufile-compat.sh" "$base"
export CUFILE_FORCE_COMPAT_MODE=true
unset CUFILE_STATS_LEVEL

mnt=""
pid=""
cleanup() {
	if [ -n "$mnt" ]; then
		"$here/gdsfs" umount "$mnt" 2>/dev/null || true
	fi
	if [ -n "$pid" ]; then
		kill "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	fi
	mnt="" pid=""
}
trap 'cleanup; rm -rf "$work"' EXIT

# mount NAME COMPAT: mounts $work/src on $work/mnt-NAME with io.compat_mode
# COMPAT, in the background, logging to $out/cufile-stats-NAME.log.
mount_gdsfs() {
	mnt="$work/mnt-$1"
	mkdir -p "$mnt"
	"$here/gdsfs" mount --set staging.device=cuda --set staging.prefetch=manual --set log.format=console \
		--set io.compat_mode="$2" --set ipc.socket="$work/$1.sock" "$work/src" "$mnt" 2> "$out/cufile-stats-$1.log" &
	pid=$!
	for _ in $(seq 200); do
		[ -e "$mnt/.gdsfs/version" ] && return 0
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.1
	done
	echo "FAIL: the $1 mount did not come up:"
	cat "$out/cufile-stats-$1.log"
	exit 1
}

# stage FILE: stages $mnt/FILE and fails unless it ends resident.
stage() {
	"$here/gdsfs" warmup --wait "$mnt/$1" || failed "warmup --wait $1"
	grep "^$1	" "$mnt/.gdsfs/cache" || true
}

# verify KIND FILES...: the assertions on the stats.json files (python3).
verify() {
	python3 - "$size" "$@" <<'EOF'
import json, sys

size, kind, files = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
stats = [json.load(open(f)) for f in files]
bad = False

def line(ok, msg):
    global bad
    print(("PASS: " if ok else "FAIL: ") + msg)
    bad = bad or not ok

def gpu(m):
    dev = m["devices"][0]
    cf = m["cufile"]
    for g in cf.get("gpus") or []:
        if g["name"] == dev["name"] or (g["name"] == "gpu%d" % g["index"] and g["index"] == dev["ordinal"]):
            return dev, cf, g
    return dev, cf, {"name": "(none)", "read_bytes": 0, "reads": 0, "nvfs_reads": 0, "posix_reads": 0, "p2p_reads": 0}

if kind == "off":
    m = stats[0]
    dev, cf, g = gpu(m)
    print("gdsfs: %s bytes_cufile=%d bytes_posix=%d cufile_mode=%s" % (dev["name"], dev["bytes_cufile"], m["bytes_posix"], m["cufile_mode"]))
    print("cufile: statistics=%s %s read_bytes=%d reads=%d nvfs_reads=%d posix_reads=%d p2p_reads=%d" % (
        cf["statistics"], g["name"], g["read_bytes"], g["reads"], g["nvfs_reads"], g["posix_reads"], g["p2p_reads"]))
    line(cf["statistics"] == "level 3", "cuFile statistics on at level 3: %s" % cf["statistics"])
    line(dev["bytes_cufile"] == size, "gdsfs bytes_cufile %d == file size %d" % (dev["bytes_cufile"], size))
    line(dev["bytes_cufile"] == g["read_bytes"], "gdsfs bytes_cufile %d == cuFile read_bytes %d on %s" % (dev["bytes_cufile"], g["read_bytes"], g["name"]))
    line(g["posix_reads"] > 0 and g["nvfs_reads"] + g["p2p_reads"] == 0,
         "cuFile counted the POSIX path (compat mode): posix_reads=%d nvfs_reads=%d p2p_reads=%d" % (g["posix_reads"], g["nvfs_reads"], g["p2p_reads"]))
    line(cf["attribution"] == "ok", "attribution: %s" % cf["attribution"])
elif kind == "on":
    before, after = stats
    _, _, g0 = gpu(before)
    dev, cf, g1 = gpu(after)
    print("gdsfs: bytes_posix %d -> %d, bytes_cufile %d" % (before["bytes_posix"], after["bytes_posix"], dev["bytes_cufile"]))
    print("cufile: statistics=%s read_bytes %d -> %d, reads %d -> %d" % (cf["statistics"], g0["read_bytes"], g1["read_bytes"], g0["reads"], g1["reads"]))
    line(after["bytes_posix"] - before["bytes_posix"] == size, "gdsfs bytes_posix grew by %d, want %d" % (after["bytes_posix"] - before["bytes_posix"], size))
    line(dev["bytes_cufile"] == 0, "gdsfs bytes_cufile %d == 0 on the POSIX path" % dev["bytes_cufile"])
    line(cf["statistics"] == "level 3", "cuFile statistics on at level 3: %s" % cf["statistics"])
    line((g0["read_bytes"], g0["reads"]) == (g1["read_bytes"], g1["reads"]) and (cf["read_bytes"], cf["read_ops"]) == (before["cufile"]["read_bytes"], before["cufile"]["read_ops"]),
         "cuFile's counters did not move: read_bytes %d -> %d, reads %d -> %d" % (g0["read_bytes"], g1["read_bytes"], g0["reads"], g1["reads"]))
    line(cf["attribution"] == "ok", "attribution: %s" % cf["attribution"])
elif kind == "check":
    m, check = stats
    _, _, g = gpu(m)
    want = "gds" if g["nvfs_reads"] + g["p2p_reads"] > 0 else "compat (posix)" if g["posix_reads"] > 0 else "none"
    if want == "gds" and g["posix_reads"] > 0:
        want = "gds+compat (posix)"
    line(check["cufile_path"] == want, "gdsfs check cufile_path %r == the path cuFile counted under io.compat_mode=off (%r)" % (check["cufile_path"], want))
    print("check verdict: %s" % check["verdict"])
sys.exit(1 if bad else 0)
EOF
}

mkdir -p "$work/src"
echo "writing two files of $size bytes under $work/src"
head -c "$size" /dev/urandom > "$work/src/cufile.bin"
head -c "$size" /dev/urandom > "$work/src/posix.bin"

echo "=== 1. io.compat_mode=off: the cuFile path"
mount_gdsfs off off
stage cufile.bin
cp "$mnt/.gdsfs/stats.json" "$out/cufile-stats-off.json"
sed -n '/^\[cufile\]/,/^$/p' "$mnt/.gdsfs/stats"
verify off "$out/cufile-stats-off.json" || fail=1
if grep -q "disagrees with cuFile" "$out/cufile-stats-off.log"; then
	failed "the daemon logged an attribution mismatch: $(grep 'disagrees with cuFile' "$out/cufile-stats-off.log")"
fi
cleanup

echo "=== 2. io.compat_mode=on: gdsfs's POSIX path"
mount_gdsfs on on
cp "$mnt/.gdsfs/stats.json" "$out/cufile-stats-on-before.json"
stage posix.bin
cp "$mnt/.gdsfs/stats.json" "$out/cufile-stats-on-after.json"
verify on "$out/cufile-stats-on-before.json" "$out/cufile-stats-on-after.json" || fail=1
cleanup

echo "=== 3. gdsfs check: the path cuFile counted"
"$here/gdsfs" check --json --dir "$work/src" > "$out/cufile-stats-check.json" || true
verify check "$out/cufile-stats-off.json" "$out/cufile-stats-check.json" || fail=1

echo "=== shim.h's statistics layout against cufile.h"
hdr=""
for h in /usr/local/cuda/targets/x86_64-linux/include/cufile.h /usr/local/cuda-*/targets/x86_64-linux/include/cufile.h /usr/local/cuda/include/cufile.h; do
	[ -f "$h" ] && hdr=$h && break
done
if [ -z "$hdr" ]; then
	echo "NOTE: no cufile.h here: layout not compared"
else
	sed -n '/typedef struct CUfileOpCounter/,/} CUfileStatsLevel3_t;/p' "$hdr" > "$out/cufile-h-stats.txt"
	echo "cufile.h: $hdr (statistics structs copied to $out/cufile-h-stats.txt)"
	if command -v cc >/dev/null; then
		cat > "$work/layout.c" <<'EOF'
#include <stddef.h>
#include <stdio.h>
#include <cufile.h>
int main(void)
{
	printf("%zu %zu %zu %zu %zu %zu %zu %zu %zu %zu\n", sizeof(CUfileStatsLevel1_t),
	       offsetof(CUfileStatsLevel1_t, read_bytes), sizeof(CUfileStatsLevel2_t), sizeof(CUfilePerGpuStats_t),
	       offsetof(CUfilePerGpuStats_t, n_nvfs_reads), offsetof(CUfilePerGpuStats_t, n_posix_reads),
	       offsetof(CUfilePerGpuStats_t, n_reads_err), offsetof(CUfileStatsLevel3_t, num_gpus),
	       offsetof(CUfileStatsLevel3_t, per_gpu_stats), sizeof(CUfileStatsLevel3_t));
	return 0;
}
EOF
		inc=$(dirname "$hdr")
		if cc -I"$inc" -o "$work/layout" "$work/layout.c" 2> "$work/layout.err"; then
			got=$("$work/layout")
			want="512 96 1024 248 64 72 112 1024 1032 5000"
			if [ "$got" = "$want" ]; then
				pass "cufile.h layout (L1 size, read_bytes; L2; per-GPU size, nvfs, posix, err; L3 num_gpus, per_gpu, size): $got"
			else
				failed "cufile.h layout $got, shim.h asserts $want"
			fi
		else
			echo "NOTE: cc could not compile against $hdr: $(head -3 "$work/layout.err")"
		fi
	else
		echo "NOTE: no cc here: compare $out/cufile-h-stats.txt with gpu/cuda/shim.h by eye"
	fi
fi

if [ "$fail" = 0 ]; then
	echo "PASS: cufile-stats-gpu"
else
	echo "FAIL: cufile-stats-gpu"
fi
exit $fail
