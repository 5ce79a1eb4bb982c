#!/bin/sh
# A cold load through the mount by two loaders, against the same load from
# SOURCE, alternated in one run: the ratio of the target "plain through the
# mount at least 0.95 of plain from SOURCE" (docs/benchmarks.md). twice:
# opens the file twice (a 4 KiB header read, close, then the whole file).
# mmap: as safetensors 0.8 does, open, map the file, close, then copy the
# whole mapping out (mmap(2) through ctypes: Python's mmap module keeps a
# duplicate descriptor, so the mount would see the last close after the
# reads).
# The disk is a loop device (direct I/O) throttled to a steady rate, so the
# page cache can be dropped and the disk's rate does not wander:
#
#   sh scripts/cold-open-twice.sh [BIN [SIZE_MIB [RATE_MBPS [ROUNDS [LOADERS]]]]]
#
# BIN: the gdsfs binary (default bin/gdsfs); SIZE_MIB: the file (1536);
# RATE_MBPS: the disk's read rate (1500; cgroup v1 blkio or v2 io.max);
# ROUNDS (3); LOADERS ("twice mmap"). Needs root, losetup, mkfs.ext4 and python3. Each gdsfs
# mount is made for one load and unmounted after it, so no staging runs
# beside another measurement.
set -eu
bin=$(realpath "${1:-bin/gdsfs}")
size=${2:-1536}
rate=${3:-1500}
rounds=${4:-3}
loaders=${5:-twice mmap}
w=$(mktemp -d /var/tmp/gdsfs-cold-XXXXXX)
img=$w/disk.img
truncate -s $((size + 512))M "$img"
dev=$(losetup --direct-io=on -f --show "$img")
cleanup() {
	umount "$w/mnt" 2>/dev/null || true
	umount "$w/disk" 2>/dev/null || true
	losetup -d "$dev" 2>/dev/null || true
	rm -rf "$w"
}
trap cleanup EXIT
mkfs.ext4 -q "$dev"
mkdir -p "$w/disk" "$w/mnt"
mount "$dev" "$w/disk"
mkdir "$w/disk/src"
head -c $((size << 20)) /dev/urandom > "$w/disk/src/big.bin"
sync
majmin=$(printf '%d:%d' "$(stat -c '0x%t' "$dev")" "$(stat -c '0x%T' "$dev")")
bps=$((rate * 1000000))
if [ -w /sys/fs/cgroup/blkio/blkio.throttle.read_bps_device ]; then
	echo "$majmin $bps" > /sys/fs/cgroup/blkio/blkio.throttle.read_bps_device
elif [ -w /sys/fs/cgroup/io.max ]; then
	echo "$majmin rbps=$bps" > /sys/fs/cgroup/io.max
else
	echo "no blkio throttle here: the disk runs at its own (varying) rate"
fi
cat > "$w/load.py" <<'PY'
import ctypes, os, sys, time
how, p = sys.argv[1], sys.argv[2]
t = time.perf_counter()
if how == "twice":
    with open(p, "rb") as f:
        f.read(4096)
    with open(p, "rb") as f:
        while f.read(16 << 20):
            pass
else:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    fd = os.open(p, os.O_RDONLY)
    size = os.fstat(fd).st_size
    addr = libc.mmap(None, size, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED
    os.close(fd)
    if addr in (None, ctypes.c_void_p(-1).value):
        sys.exit("mmap: errno %d" % ctypes.get_errno())
    for off in range(0, size, 1 << 20):  # copied out in 1 MiB pieces
        ctypes.string_at(addr + off, min(1 << 20, size - off))
    libc.munmap(addr, size)
print("%.3f" % (time.perf_counter() - t))
PY
cold() { sync; echo 3 > /proc/sys/vm/drop_caches; python3 "$w/load.py" "$1" "$2"; }
for how in $loaders; do
	echo "cold load ($how) of a ${size} MiB file, disk at ${rate} MB/s; seconds"
	printf '%-6s %-8s %-8s %s\n' round SOURCE mount mount/SOURCE
	i=0
	while [ $i -lt "$rounds" ]; do
		i=$((i + 1))
		src=$(cold "$how" "$w/disk/src/big.bin")
		"$bin" mount --set ipc.socket="$w/s.sock" "$w/disk/src" "$w/mnt" 2>"$w/daemon.log" &
		n=0
		until [ -e "$w/mnt/.gdsfs/version" ]; do n=$((n + 1)); [ $n -lt 100 ] || { cat "$w/daemon.log"; exit 1; }; sleep 0.1; done
		mnt=$(cold "$how" "$w/mnt/big.bin")
		umount "$w/mnt"
		wait
		printf '%-6s %-8s %-8s %s\n' "$i" "$src" "$mnt" "$(python3 -c "print('%.2f' % ($src / $mnt))")"
	done
done
