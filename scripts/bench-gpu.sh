#!/bin/sh
# shellcheck disable=SC2086 # flag strings are split into words on purpose
# Every benchmark with a speed target on a GPU machine in one command
# (about 9 minutes with the KvikIO build), run from the repository root
# with the binary `make gpu-bundle` put in .bin/ (the GPU machine has no Go):
#
#   sh scripts/bench-gpu.sh --prepare   # here, once: copies ../shared/peers/kvikio to .bin/kvikio
#   sh scripts/bench-gpu.sh             # there: every step below, full sizes
#   sh scripts/bench-gpu.sh --dry-run   # anywhere: host backend, small sizes
#   sh scripts/bench-gpu.sh --verdict LOG [STEP...]  # the summary of a log, STEPs failed
#
# Steps, each a `gdsfs bench` subcommand with its own targets:
#   1. kvikbench built from .bin/kvikio (KvikIO's reader, compat mode)
#   2. stage --kvikio --cold: KvikIO's best of threads {8,16,24,32} x tasks
#      {2,4,8} MiB vs gdsfs's defaults in each of 2 rounds, vs the pinned H2D
#      copy, a 4 GiB warm file; cold vs the disk read buffered and O_DIRECT
#   3. lease: first and repeat leases, Go and Python, 1 MiB / 32 MiB / 1 GiB,
#      medians of 30, and the raw import-and-map floor
#   4. loader: DataLoader epochs over 64 x 32 MiB and 1024 x 1 MiB resident
#      files (leases vs read() through the mount), gdsfs.load of the 4 GiB
#      file not yet resident and after a plain read (cat, evict) vs the
#      pinned H2D copy
#   5. contention: 16 consumers x 8 files of 256 MiB, capacity 800 MiB
#   6. readahead: 64 x 32 MiB cold shards, 4 workers off / on / replay, and
#      one worker computing each shard as long as the disk reads one
#   7. mount: metadata and reads over 100,000 files, native vs gdsfs
# GDSFS_BENCH_STEPS picks steps (default "stage lease loader contention
# readahead mount"; the dry run leaves mount out: it has no host-backend
# run); "autoload" is the unmodified-loader figure (gdsfs bench autoload,
# minutes): GDSFS_BENCH_STEPS="autoload" runs only that.
# GDSFS_BENCH_SET="KEY=VALUE ..." adds config.yaml keys to every step's
# --set (GDSFS_BENCH_SET=io.compat_mode=off on a machine without cuFile
# set up must make the run fail).
#
# Outputs, in $OUT (default a new directory from mktemp -d, named at the
# start; an $OUT another user owns or may write is refused): bench-gpu.txt (all that
# was printed, the daemon logs' ends after a failed step, a summary of the
# targets) and bench-gpu.jsonl (one JSON line per step). Work files in
# $GDSFS_BENCH_DIR (default /var/tmp/gdsfs-bench; a disk filesystem, about
# 12 GiB). Exits 1 when any step exited non-zero (each gdsfs bench command
# exits 1 on a MISS, a FAIL, a target not checked or a case that could not
# run: see its --help), or any line of the log says FAIL, MISS or "not
# checked" (step-verdict.py bench). Only then does it say "every step
# measured, every target passed".
set -u
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
cd "$repo"

mode=gpu

# verdict LOG [STEP...]: the summary of the targets in LOG, and the exit
# status of the whole run (STEPs are the steps that exited non-zero).
verdict() {
	vlog=$1
	shift
	echo ""
	echo "=== summary: targets"
	grep -E '^(target[[:space:]]|\| target:)' "$vlog"
	if python3 "$here/step-verdict.py" bench "$vlog" "$@"; then
		echo "BENCH DONE: every step measured, every target passed"
		return 0
	fi
	echo "BENCH FAILED: see the FAIL lines above"
	return 1
}

case "${1:-}" in
--verdict)
	shift
	[ $# -ge 1 ] || { echo "usage: sh scripts/bench-gpu.sh --verdict LOG [FAILED_STEP...]"; exit 2; }
	verdict "$@"
	exit ;;
--prepare)
	src=${KVIKIO_SRC:-}
	for d in ../shared/peers/kvikio /work/shared/peers/kvikio; do
		[ -z "$src" ] && [ -f "$d/build.sh" ] && src=$d
	done
	[ -f "$src/build.sh" ] || { echo "no KvikIO reader sources in ../shared/peers/kvikio (KVIKIO_SRC=DIR)"; exit 1; }
	mkdir -p .bin && rm -rf .bin/kvikio && cp -r "$src" .bin/kvikio && echo "copied $src to .bin/kvikio"
	exit 0 ;;
--dry-run) mode=dry ;;
"") ;;
*) echo "usage: sh scripts/bench-gpu.sh [--prepare | --dry-run | --verdict LOG [STEP...]]"; exit 2 ;;
esac

. "$here/outdir.sh"
out=$(outdir gdsfs-bench-out) || exit 1
echo "outputs in $out"
work=${GDSFS_BENCH_DIR:-/var/tmp/gdsfs-bench}
bin=$repo/.bin/gdsfs
log=$out/bench-gpu.txt
json=$out/bench-gpu.jsonl
: > "$log"
: > "$json"
failed=""
t0=$(date +%s)

say() { echo "$*" | tee -a "$log"; }

# step NAME LIMIT_S CMD...: runs CMD, all output to the terminal and the log;
# a non-zero exit is a failed step (named in the summary, exit 1 at the end).
step() {
	name=$1 limit=$2
	shift 2
	say ""
	say "=== $name ($(date +%H:%M:%S)): $*"
	s=$(date +%s)
	{ timeout -k 10 "$limit" "$@" 2>&1; echo $? > "$out/.rc"; } | tee -a "$log"
	rc=$(cat "$out/.rc")
	if [ "$rc" = 0 ]; then
		say "--- ok: $name ($(( $(date +%s) - s )) s)"
	else
		[ "$rc" = 124 ] && say "--- $name ran past its limit of $limit s"
		say "--- FAIL: $name (exit $rc, $(( $(date +%s) - s )) s)"
		failed="$failed $name"
		[ -O "$work" ] && for l in "$work"/*.log; do
			[ -f "$l" ] && { say "--- end of $l:"; tail -n 15 "$l" | tee -a "$log"; }
		done
	fi
}

[ -x "$bin" ] || { say "FAIL: no $bin: run 'make gpu-bundle' here first (it builds .bin/)"; exit 1; }
say "gdsfs bench-gpu.sh, mode $mode, $(date -u +%Y-%m-%dT%H:%M:%SZ), $("$bin" version 2>/dev/null | head -n 1)"
say "work $work; outputs $log $json"

if [ $mode = gpu ]; then
	set_dev=""
	nvidia-smi -L 2>&1 | tee -a "$log" || { say "FAIL: nvidia-smi finds no GPU"; exit 1; }
	python3 -c 'import torch; assert torch.cuda.is_available(), "torch sees no GPU"' >> "$log" 2>&1 ||
		{ say "FAIL: python3 with torch on the GPU is needed (see above)"; failed="$failed python3-torch"; }
	kvsrc=""
	case " ${GDSFS_BENCH_STEPS:-stage} " in *" stage "*) ;; *) kvsrc=none ;; esac
	for d in "${KVIKIO_SRC:-}" .bin/kvikio shared/peers/kvikio ../shared/peers/kvikio; do
		[ -z "$kvsrc" ] && [ -n "$d" ] && [ -f "$d/build.sh" ] && kvsrc=$d
	done
	kvik=$out/kvikbench
	rm -f "$kvik"
	if [ "$kvsrc" = none ]; then
		kvik_flags=""
	elif [ -z "$kvsrc" ]; then
		say "=== kvikbench: no sources (.bin/kvikio: run 'sh scripts/bench-gpu.sh --prepare' here before carrying .bin)"
		say "--- FAIL: kvikbench"
		failed="$failed kvikbench"
		kvik_flags=""
	else
		step kvikbench 120 sh "$kvsrc/build.sh" "$kvik"
		kvik_flags=""
		[ "$rc" = 0 ] && [ -x "$kvik" ] && kvik_flags="--kvikio $kvik"
	fi
	stage="--size 4GiB --rounds 2 --runs 3 --quick --cold $kvik_flags"
	lease="--sizes 1MiB,32MiB,1GiB --runs 30 --first 30"
	loader="--shards 64 --shard-size 32MiB --files 1024 --file-size 1MiB --big 4GiB --epochs 3 --runs 3 --workers 8"
	contention="--consumers 16 --files 8 --file-size 256MiB --capacity 800MiB"
	mount="--files 100000 --runs 2"
else
	set_dev="--set staging.device=host"
	stage="--size 256MiB --rounds 2 --runs 2 --quick --kvikio /bin/true"
	lease="--sizes 1MiB,32MiB,64MiB --runs 30 --first 5"
	loader="--shards 16 --shard-size 4MiB --files 128 --file-size 256KiB --big 256MiB --epochs 2 --runs 2 --workers 2"
	contention="--consumers 16 --files 8 --file-size 4MiB --capacity 12.5MiB"
	mount="--files 2000 --runs 2 --size 64MiB"
fi

for kv in ${GDSFS_BENCH_SET:-}; do set_dev="$set_dev --set $kv"; done
# The flag strings below are split into words on purpose (unquoted).
common="--dir $work --report $json $set_dev"
quick=""
[ $mode = dry ] && quick=--quick
steps="stage lease loader contention readahead mount"
if [ $mode = dry ]; then
	# gdsfs bench mount has no host-backend run: its targets are timings
	# of whatever machine it runs on, a busy one included.
	steps="stage lease loader contention readahead"
	[ -z "${GDSFS_BENCH_STEPS:-}" ] && say "=== mount: left out of the dry run (its targets time this machine; GDSFS_BENCH_STEPS=mount runs it)"
fi
for st in ${GDSFS_BENCH_STEPS:-$steps}; do
	case $st in
	stage) step stage 240 "$bin" bench stage --dir "$work/files" --report "$json" $set_dev $stage ;;
	lease) step lease 180 "$bin" bench lease $common $lease ;;
	loader) step loader 240 "$bin" bench loader $common $loader ;;
	contention) step contention 180 "$bin" bench contention $common $contention ;;
	readahead) step readahead 300 "$bin" bench readahead --dir "$work" $set_dev $quick ;;
	mount) step mount 240 "$bin" bench mount --dir "$work/mount" $mount ;;
	autoload) step autoload 900 "$bin" bench autoload --dir "$work" $set_dev $quick ;;
	*) say "=== $st: no such step"; say "--- FAIL: $st"; failed="$failed $st" ;;
	esac
done

rm -f "$out/.rc"
say ""
say "=== $(( $(date +%s) - t0 )) s"
# shellcheck disable=SC2086 # one word per failed step
verdict "$log" $failed > "$out/.verdict"
rc=$?
tee -a "$log" < "$out/.verdict"
rm -f "$out/.verdict"
exit $rc
