#!/bin/sh
# Mount test on a GPU machine: opening a file through the mount stages it
# on the GPU by the expected path ($1: posix or cufile); the Go client maps
# the staged bytes over CUDA IPC and their SHA-256 equals the file's.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
want=$1
dir="$GDSFS_TEST_DIR/mount-$want"
rm -rf "$dir"
mkdir -p "$dir/src" "$dir/mnt"
head -c 268435469 /dev/urandom > "$dir/src/data.bin" # 256 MiB + 13
compat=auto
[ "$want" = cufile ] && compat=off # auto takes cuFile only in gds mode
"$here/gdsfs" mount --set staging.device=cuda --set log.format=console --set io.compat_mode=$compat \
	--set ipc.socket="$dir/s.sock" "$dir/src" "$dir/mnt" 2> "$dir/log" &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; cat "$dir/log"' EXIT
for _ in $(seq 100); do [ -e "$dir/mnt/.gdsfs/version" ] && break; sleep 0.1; done
cat "$dir/mnt/.gdsfs/version"
cat "$dir/mnt/data.bin" > /dev/null
for _ in $(seq 200); do
	state=$(cat "$dir/mnt/.gdsfs/cache" | awk -F'\t' '$1 == "data.bin" {print $3}')
	[ "$state" = resident ] && break
	case "$state" in failed*) break ;; esac
	sleep 0.1
done
cat "$dir/mnt/.gdsfs/cache"
path=$(awk -F'\t' '$1 == "data.bin" {print $4}' "$dir/mnt/.gdsfs/cache")
[ "$state" = resident ] || { echo "state $state"; exit 1; }
[ "$path" = "$want" ] || { echo "load path $path, want $want"; exit 1; }
got=$("$here/leasecheck" "$dir/mnt/data.bin")
echo "$got"
want_sum=$(sha256sum < "$dir/src/data.bin" | cut -d' ' -f1)
echo "$got" | grep -q "\"sha256\":\"$want_sum\"" || { echo "leased bytes differ"; exit 1; }
echo "$got" | grep -q '"device":"GPU-' || { echo "not on a GPU"; exit 1; }
grep -E "bytes_(posix|cufile)|cufile_mode|leases" "$dir/mnt/.gdsfs/stats"
