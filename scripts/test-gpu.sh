#!/bin/sh
# The GPU test tier (make test-gpu), run from the bundle `make gpu-bundle`
# puts in .bin/ (the GPU machine has no Go). Every test fails, never skips,
# where no GPU answers (GDSFS_REQUIRE_GPU=1).
#
# Order matters: the cuFile tests of the default machine state run first;
# then, only with GDSFS_CUFILE_SETUP=1, this script does the test-machine
# setup of shared/device/README.md (a udev entry for the test disk and
# CUFILE_FORCE_COMPAT_MODE=true) and runs the cuFile path for real.
#
# Environment: GDSFS_TEST_DIR (a directory on a disk filesystem, default
# /var/tmp/gdsfs-gpu), GDSFS_GPU_SIZES (see staging/gputest), GDSFS_LOG
# (a file to append everything to).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
export GDSFS_REQUIRE_GPU=1
export GDSFS_TEST_DIR="${GDSFS_TEST_DIR:-/var/tmp/gdsfs-gpu}"
mkdir -p "$GDSFS_TEST_DIR"
fail=0
step() {
	name=$1
	shift
	echo "=== $name"
	if "$@"; then echo "--- ok: $name"; else echo "--- FAIL: $name"; fail=1; fi
}

step "cuda backend" "$here/cuda.test" -test.v -test.count=1
step "staging, POSIX path, every byte verified" \
	"$here/gpustaging.test" -test.v -test.count=1 -test.run 'POSIXPath'
step "lease integrity on CUDA under concurrent rewrites, POSIX path (sha256 of every lease)" \
	"$here/gpustaging.test" -test.v -test.count=1 -test.run 'LeaseIntegrityCUDA/compat_mode=on'
step "GPUDirect Storage proper where cuFile reports gds (skips, saying so, in compat)" \
	"$here/gpustaging.test" -test.v -test.count=1 -test.run 'GDSMode'
step "auto in the default machine state picks POSIX and says why" \
	env GDSFS_EXPECT_AUTO=posix "$here/gpustaging.test" -test.v -test.count=1 -test.run 'AutoPicks'
step "replicas on two GPUs: split ingest, peer copies, every byte (one GPU: SKIPPED: needs 2 GPUs)" \
	"$here/gpustaging.test" -test.v -test.count=1 -test.run 'ReplicasTwoGPUs'
step "mount on the GPU: open stages, the Go client maps the bytes" sh "$here/mount-gpu.sh" posix
if [ "${GDSFS_PYTHON_TESTS:-1}" = 1 ]; then
	step "python client on the GPU" env GDSFS_BIN="$here/gdsfs" PYTHONPATH="$repo/python" \
		python3 -m unittest discover -s "$repo/python/tests" -p 'test_gpu*.py' -v
	step "torch consumers: 1 GiB and 4 GiB zero-copy tensors, four processes" sh "$here/torch-gpu.sh"
	step "leases: Go client without cgo, shared writes fault, private copies, repeat-lease latency" \
		sh "$here/lease-gpu.sh"
fi
if [ "${GDSFS_CUFILE_SETUP:-0}" = 1 ]; then
	echo "=== test-machine setup: cuFile compat mode for $GDSFS_TEST_DIR"
	sh "$here/cufile-compat.sh" "$GDSFS_TEST_DIR"
	export CUFILE_FORCE_COMPAT_MODE=true GDSFS_REQUIRE_CUFILE=1
	step "cuda backend cuFile" "$here/cuda.test" -test.v -test.count=1 -test.run 'CuFile'
	step "staging, cuFile path, every byte verified" \
		"$here/gpustaging.test" -test.v -test.count=1 -test.run 'CuFilePath'
	step "lease integrity on CUDA under concurrent rewrites, cuFile path" \
		"$here/gpustaging.test" -test.v -test.count=1 -test.run 'LeaseIntegrityCUDA/compat_mode=off'
	step "auto with cuFile in compat mode picks POSIX (faster) and says why" \
		env GDSFS_EXPECT_AUTO=posix "$here/gpustaging.test" -test.v -test.count=1 -test.run 'AutoPicks'
	step "mount on the GPU, cuFile path (io.compat_mode=off)" sh "$here/mount-gpu.sh" cufile
fi
[ $fail = 0 ] && echo "GPU TESTS PASSED" || echo "GPU TESTS FAILED"
exit $fail
