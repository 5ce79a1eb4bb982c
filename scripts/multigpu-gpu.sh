#!/bin/sh
# Several GPUs (docs/multi-gpu.md) measured on two GPUs in one command, a
# few minutes, from the repository root with the binary `make gpu-bundle`
# put in .bin/gdsfs (so the GPU machine needs no Go):
#
#   sh scripts/multigpu-gpu.sh             # there: 2 GPUs, two 8 GiB files
#   sh scripts/multigpu-gpu.sh --dry-run   # anywhere: host backend, two host devices, 64 MiB files
#
# 1. `gdsfs check`: the topology it finds (peer access, link) and the GPUs.
# 2. `gdsfs bench multigpu` (its --help says all): baselines (pinned H2D per
#    GPU and both at once, peer copy each way, host memcpy); an 8 GiB file
#    onto both GPUs with split ingest vs one after the other (target <= 0.6
#    of the time); two 8 GiB files onto the two GPUs at once vs one (target
#    >= 1.6 x, or the host memory bandwidth if lower); then through a mount:
#    warmup --gpus all, a consumer per GPU (CUDA_VISIBLE_DEVICES one each)
#    and one seeing both get local pointers with the file's sha256, a killed
#    consumer frees only its lease, evicting one replica leaves the other
#    served.
#
# Outputs in $OUT (default a new directory from mktemp -d, named at the
# start; an $OUT another user owns or may write is refused): multigpu-gpu.txt (all
# that was printed and a summary), multigpu-gpu.jsonl (the bench's JSON),
# check.txt, and daemon.log (the mount's log). The files go to /dev/shm when
# it has room (GDSFS_MULTIGPU_DIR overrides) and are removed at the end.
# Exits 1 naming what failed: no binary, fewer than 2 GPUs, a consumer
# check, or a measurement that could not be made. A missed speed target is
# a result (listed in the summary), not a failure.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
cd "$repo"

mode=gpu
case "${1:-}" in
--dry-run) mode=dry ;;
"") ;;
*) echo "usage: sh scripts/multigpu-gpu.sh [--dry-run]" >&2; exit 2 ;;
esac

. "$here/outdir.sh"
out=$(outdir gdsfs-multigpu-out)
echo "outputs in $out"
work=${GDSFS_MULTIGPU_WORK:-/var/tmp/gdsfs-multigpu}
bin=$repo/.bin/gdsfs
log=$out/multigpu-gpu.txt
json=$out/multigpu-gpu.jsonl
: > "$log"
: > "$json"
t0=$(date +%s)
say() { echo "$*" | tee -a "$log"; }
fail() { say "MULTIGPU FAILED: $*"; exit 1; }

[ -x "$bin" ] || fail "no $bin: run 'make gpu-bundle' (or go build -o .bin/gdsfs ./cmd/gdsfs) where Go is, and carry .bin/gdsfs"
[ "$(id -u)" = 0 ] || fail "run as root: the consumer checks mount a gdsfs filesystem"
[ -e /dev/fuse ] || fail "no /dev/fuse: the consumer checks mount a gdsfs filesystem"
command -v python3 > /dev/null || fail "no python3: the consumers are Python (python/gdsfs)"

if [ $mode = gpu ]; then
	size=8GiB need_gib=18 runs=3
	sets=""
	gpus=$(nvidia-smi -L 2>&1 | tee -a "$log" | grep -c '^GPU ' || true)
	[ "$gpus" -ge 2 ] || fail "nvidia-smi lists $gpus GPU(s); this needs 2"
	python3 -c 'import torch; assert torch.cuda.device_count() >= 2' >> "$log" 2>&1 ||
		say "note: python3 has no torch seeing 2 GPUs; the consumers check locality through the driver only"
else
	size=64MiB need_gib=1 runs=2
	sets="--set staging.device=host --set staging.host_devices=2"
fi

# The files: in memory (/dev/shm) when it has room for both and some to spare.
dir=${GDSFS_MULTIGPU_DIR:-}
if [ -z "$dir" ]; then
	avail=$(df -Pk /dev/shm 2> /dev/null | awk 'NR==2 {print int($4 / 1048576)}')
	if [ "${avail:-0}" -ge $need_gib ]; then dir=/dev/shm/gdsfs-multigpu; else dir=$work/files; fi
fi
cleanup() { [ -O "$dir" ] && [ ! -L "$dir" ] && rm -f "$dir/multigpu-a.bin" "$dir/multigpu-b.bin"; }
trap cleanup EXIT

say "gdsfs multigpu-gpu.sh, mode $mode, $(date -u +%Y-%m-%dT%H:%M:%SZ), $("$bin" version 2> /dev/null | head -n 1)"
say "files in $dir ($size each), work $work, outputs in $out"

say ""
say "=== check (topology)"
"$bin" check > "$out/check.txt" 2>&1 || true
sed -n '/^\[topology\]/,/^$/p' "$out/check.txt" | tee -a "$log"
grep -E '^ *device\.[0-9]' "$out/check.txt" | tee -a "$log" || true

say ""
say "=== bench multigpu ($(date +%H:%M:%S))"
# $sets is split into words on purpose.
# shellcheck disable=SC2086
{
	timeout -k 10 420 "$bin" bench multigpu --size $size --runs $runs --dir "$dir" --work "$work" --report "$json" $sets 2>&1
	echo $? > "$out/.rc"
} | tee -a "$log"
rc=$(cat "$out/.rc")
rm -f "$out/.rc"
[ -O "$work" ] && [ -f "$work/multigpu.log" ] && cp "$work/multigpu.log" "$out/daemon.log"

say ""
say "=== summary ($(($(date +%s) - t0)) s)"
grep -E '^(target|consumer  FAIL)' "$log" | tee -a "$log.summary" || true
cat "$log.summary" >> "$log" 2> /dev/null || true
rm -f "$log.summary"
case $rc in
0) ;;
124 | 137) fail "bench multigpu ran past its limit of 420 s (daemon log: $out/daemon.log)" ;;
*) fail "bench multigpu exited $rc: a target missed or not checked, a consumer FAIL line, or the error above (daemon log: $out/daemon.log)" ;;
esac
say "MULTIGPU DONE: every figure measured, every target and consumer check passed"
