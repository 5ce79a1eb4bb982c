# Sourced by bench-gpu.sh, bench-ab.sh and multigpu-gpu.sh from beside them.

# outdir NAME: $OUT, where it is a directory of the caller's that no one
# else may write (else exit 1), or a fresh one from mktemp -d.
outdir() {
	if [ -z "${OUT:-}" ]; then
		mktemp -d "${TMPDIR:-/tmp}/$1.XXXXXX" || exit 1
		return
	fi
	mkdir -p "$OUT" || exit 1
	if [ -L "$OUT" ] || [ ! -O "$OUT" ] || [ -n "$(find "$OUT" -maxdepth 0 -perm /022)" ]; then
		echo "OUT=$OUT: not a directory of yours that only you may write (leave OUT unset for a fresh one)" >&2
		exit 1
	fi
	echo "$OUT"
}
