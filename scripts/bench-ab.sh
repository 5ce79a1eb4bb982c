#!/bin/sh
# shellcheck disable=SC2086 # flag strings are split into words on purpose
# Two gdsfs binaries measured against each other in one run: `gdsfs bench
# stage`, `lease` and `loader`, the binaries alternated in every round (A B,
# then B A, ...) so that drift of the machine falls on both. For a change
# that must not change speed (a restructuring): run it with the binary
# before and the binary after.
#
#   sh scripts/bench-ab.sh OLD_BINARY NEW_BINARY            # GPU sizes
#   GDSFS_AB_MODE=dry sh scripts/bench-ab.sh OLD NEW        # host backend, small
#
# GDSFS_AB_ROUNDS (default 2) rounds; GDSFS_AB_BENCHES (default "stage
# lease loader") the benches run in each. Outputs in $OUT (default a new
# directory from mktemp -d, named at the start; an $OUT another user owns
# or may write is refused): ab.txt (everything printed and the table) and
# a.jsonl, b.jsonl (each bench's JSON report). Work files in
# $GDSFS_BENCH_DIR (default /var/tmp/gdsfs-bench). The table gives, per
# figure, every round's value for A and B and B/A of the medians; it exits 1
# when a bench command failed to run (exit 2 or more, or no report), not on
# a ratio: what counts as noise is for the reader of the rounds.
set -u
[ $# -eq 2 ] || { echo "usage: sh scripts/bench-ab.sh OLD_BINARY NEW_BINARY"; exit 2; }
a=$1 b=$2
for x in "$a" "$b"; do [ -x "$x" ] || { echo "bench-ab: $x is not an executable"; exit 2; }; done
here=$(cd "$(dirname "$0")" && pwd)
. "$here/outdir.sh"
out=$(outdir gdsfs-ab-out) || exit 1
echo "outputs in $out"
work=${GDSFS_BENCH_DIR:-/var/tmp/gdsfs-bench}
rounds=${GDSFS_AB_ROUNDS:-2}
log=$out/ab.txt
: > "$log"
: > "$out/a.jsonl"
: > "$out/b.jsonl"

if [ "${GDSFS_AB_MODE:-gpu}" = dry ]; then
	set_dev="--set staging.device=host"
	stage="--size 64MiB --rounds 1 --runs 2 --quick"
	lease="--sizes 1MiB,32MiB --runs 10 --first 5"
	loader="--shards 8 --shard-size 4MiB --files 64 --file-size 256KiB --big 64MiB --epochs 2 --runs 1 --workers 2"
else
	set_dev=""
	stage="--size 4GiB --rounds 1 --runs 3 --quick"
	lease="--sizes 1MiB,32MiB,1GiB --runs 30 --first 30"
	loader="--shards 64 --shard-size 32MiB --files 1024 --file-size 1MiB --big 4GiB --epochs 3 --runs 2 --workers 8"
fi

failed=0
# one BIN TAG: stage, lease and loader with BIN, reports appended to TAG.jsonl.
# The bench commands exit 1 on a missed target (that is the verdict, not a
# failure to run); 2 and above, or no report line, is a failure.
one() {
	bin=$1 tag=$2
	for st in ${GDSFS_AB_BENCHES:-stage lease loader}; do
		case $st in stage | lease | loader) ;; *)
			echo "bench-ab: GDSFS_AB_BENCHES names $st; the benches are stage, lease and loader" | tee -a "$log"
			exit 2
			;;
		esac
		case $st in
		stage) args="--dir $work/files $stage" ;;
		lease) args="--dir $work $lease" ;;
		loader) args="--dir $work $loader" ;;
		esac
		before=$(wc -l < "$out/$tag.jsonl")
		echo "=== $tag $st ($(date +%H:%M:%S)): $bin bench $st $args $set_dev" >> "$log"
		"$bin" bench $st $args $set_dev --report "$out/$tag.jsonl" >> "$log" 2>&1
		rc=$?
		after=$(wc -l < "$out/$tag.jsonl")
		if [ $rc -ge 2 ] || [ "$after" -le "$before" ]; then
			echo "bench-ab: $tag $st failed (exit $rc, no report); see $log" | tee -a "$log"
			failed=1
		fi
	done
}

r=1
while [ $r -le "$rounds" ]; do
	if [ $((r % 2)) = 1 ]; then one "$a" a; one "$b" b; else one "$b" b; one "$a" a; fi
	r=$((r + 1))
done

python3 "$here/bench-ab.py" "$out/a.jsonl" "$out/b.jsonl" "$a" "$b" | tee -a "$log"
exit $failed
