#!/bin/sh
# `gdsfs check` on a GPU machine in both states, for docs/cufile.md:
#   1. as the machine comes (no nvidia-fs, no udev entry for the disk);
#   2. after a cuFile compat-mode set-up:
#      cufile-compat.sh (a udev entry for the disk under DIR) and
#      CUFILE_FORCE_COMPAT_MODE=true.
# Run from the bundle (make gpu-bundle; .bin/ holds gdsfs, this script and
# cufile-compat.sh):  sh .bin/check-gpu.sh [DIR]   (DIR default /var/tmp)
# Writes check-default.{txt,json} and check-compat.{txt,json} into $OUT (or
# the current directory) and prints both texts.
#
# What each must show (and fails here otherwise):
#   default: verdict "GDS: not available because the nvidia-fs kernel module
#     is not loaded; cuFile compat: fails (...); POSIX path: works; staging
#     device: cuda GPU-..."; a cuFile version; no field empty.
#   compat:  "cuFile compat: works" and "POSIX path: works".
set -eu
here=$(cd "$(dirname "$0")" && pwd)
dir=${1:-/var/tmp}
out=${OUT:-.}
mkdir -p "$out"
fail=0
run() {
	name=$1
	shift
	env "$@" "$here/gdsfs" check --dir "$dir" > "$out/check-$name.txt"
	env "$@" "$here/gdsfs" check --dir "$dir" --json > "$out/check-$name.json"
	echo "=== gdsfs check ($name)"
	cat "$out/check-$name.txt"
	echo
}
expect() {
	if grep -q -- "$2" "$out/check-$1.txt"; then
		echo "--- ok: $1: $2"
	else
		echo "--- FAIL: $1: want \"$2\""
		fail=1
	fi
}
run default
expect default '^GDS: not available because '
expect default 'POSIX path: works'
expect default 'staging device: cuda GPU-'
if grep -q '^version  *unknown' "$out/check-default.txt"; then
	echo "--- FAIL: default: cuFile version unknown"
	fail=1
fi
if [ ! -x "$here/cufile-compat.sh" ]; then
	echo "--- FAIL: no cufile-compat.sh beside this script (make gpu-bundle copies shared/device/cufile-compat.sh)"
	exit 1
fi
sh "$here/cufile-compat.sh" "$dir"
run compat CUFILE_FORCE_COMPAT_MODE=true
expect compat 'cuFile compat: works'
expect compat 'POSIX path: works'
exit $fail
