#!/bin/sh
# The GPU test tier (make test-gpu), run from the bundle `make gpu-bundle`
# puts in .bin/ (so the GPU machine needs no Go). Every test fails, never skips,
# where no GPU answers (GDSFS_REQUIRE_GPU=1).
#
# Each step's output goes to step-verdict.py, which passes the step only
# when its command exited 0, at least one test ran, none failed, and every
# skip is one the step names, by test, with the reason it is expected on
# the machine it runs on (one GPU: the two-GPU tests; no nvidia-fs: GDS mode; cuFile
# not set up in the machine's default state). A pattern that matches no
# test fails. The counts of every step are printed, then a summary.
#
# Order matters: the cuFile tests of the default machine state run first;
# then, only with GDSFS_CUFILE_SETUP=1, this script does the cuFile
# compat-mode set-up (cufile-compat.sh in the bundle: a udev entry for the
# test disk; and CUFILE_FORCE_COMPAT_MODE=true) and runs the cuFile path for
# real.
#
# The autoload suite runs against the installed safetensors and torch
# (GDSFS_REAL_SAFETENSORS=1, not the stand-in CI uses), over fixtures of
# every dtype the library has, written by it (make-safetensors-fixtures.py).
#
# Environment: GDSFS_TEST_DIR (a directory on a disk filesystem, default
# /var/tmp/gdsfs-gpu), GDSFS_GPU_SIZES (see staging/gputest), GDSFS_LOG
# (a file to append everything to).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
export GDSFS_REQUIRE_GPU=1
export GDSFS_TEST_DIR="${GDSFS_TEST_DIR:-/var/tmp/gdsfs-gpu}"
mkdir -p -m 700 "$GDSFS_TEST_DIR"
if [ -L "$GDSFS_TEST_DIR" ] || [ ! -O "$GDSFS_TEST_DIR" ] || [ -n "$(find "$GDSFS_TEST_DIR" -maxdepth 0 -perm /022)" ]; then
	echo "GDSFS_TEST_DIR=$GDSFS_TEST_DIR: not a directory of yours that only you may write (files are written and run there)" >&2
	exit 1
fi
out="$GDSFS_TEST_DIR/step.out"
fail=0 skipped=0 summary=""
one_gpu="one GPU on this machine: needs two"
no_nvfs="cuFile reports compat mode (no nvidia-fs): GPUDirect Storage proper cannot run here"
no_cufile="cuFile is not set up in the machine's default state (GDSFS_CUFILE_SETUP=1 runs it)"
helper="a helper the parent test runs in a child process"
no_cc="no C compiler on this machine to build the fake libcufile (CI builds and runs them)"
stand_in_only="it tries a method only the CI stand-in has (data_bytes); the installed library has none the served handle lacks"

# step NAME KIND [--skip TEST=WHY]... [--count REGEX --min N] -- CMD...:
# step-verdict.py runs CMD and judges its output as KIND.
step() {
	name=$1
	shift
	kind=$1
	shift
	echo "=== $name"
	set +e
	python3 "$here/step-verdict.py" run "$kind" "$out" "$@"
	rc=$?
	set -e
	case $rc in
	0) word=PASSED ;;
	2) word="SKIPPED (expected here)" skipped=$((skipped + 1)) ;;
	*) word=FAILED fail=1 ;;
	esac
	echo "--- $word: $name"
	summary="$summary
$word: $name: $(cat "$out.verdict" 2>/dev/null || echo 'no verdict')"
}

step "cuda backend" go --skip "TestPeerCopyTwoGPUs=$one_gpu" --skip "TestHelperChild=$helper" \
	--skip "TestCuFileReadInto=$no_cufile" --skip "TestCuFileStatsCountReads=$no_cufile" \
	--skip "TestCuFileStatsChild=$helper" --skip "TestCuFileStatsFakeLibrary=$no_cc" \
	--skip "TestCuFileStatsLevels=$no_cc" --skip "TestCuFileStatsMissingSymbols=$no_cc" \
	-- "$here/cuda.test" -test.v -test.count=1
step "staging, POSIX path, every byte verified" go -- \
	"$here/gpustaging.test" -test.v -test.count=1 -test.run 'POSIXPath'
step "lease integrity on CUDA under concurrent rewrites, POSIX path (sha256 of every lease)" go -- \
	"$here/gpustaging.test" -test.v -test.count=1 -test.run 'LeaseIntegrityCUDA/compat_mode=on'
step "GPUDirect Storage proper where cuFile reports gds" go --skip "TestGDSModeVerified=$no_nvfs" -- \
	"$here/gpustaging.test" -test.v -test.count=1 -test.run 'GDSMode'
step "auto in the default machine state picks POSIX and says why" go -- \
	env GDSFS_EXPECT_AUTO=posix "$here/gpustaging.test" -test.v -test.count=1 -test.run 'AutoPicks'
step "replicas on two GPUs: split ingest, peer copies, every byte" go --skip "TestReplicasTwoGPUs=$one_gpu" -- \
	"$here/gpustaging.test" -test.v -test.count=1 -test.run 'ReplicasTwoGPUs'
step "mount on the GPU: open stages, the Go client maps the bytes" sh --count '"sha256":"' --min 1 -- \
	sh "$here/mount-gpu.sh" posix
step "python client on the GPU" py -- env GDSFS_BIN="$here/gdsfs" PYTHONPATH="$repo/python" \
	python3 -m unittest discover -s "$repo/python/tests" -p 'test_gpu*.py' -v
step "autoload against the installed safetensors and torch, every dtype's fixture" py \
	--skip "test_method_not_served_goes_to_the_library=$stand_in_only" -- \
	env GDSFS_BIN="$here/gdsfs" PYTHONPATH="$repo/python" GDSFS_REAL_SAFETENSORS=1 \
	python3 -m unittest discover -s "$repo/python/tests" -p 'test_autoload*.py' -v
step "torch consumers: 1 GiB and 4 GiB zero-copy tensors, four processes" sh --count 'sha256 match$' --min 6 -- \
	sh "$here/torch-gpu.sh"
step "leases: Go client without cgo, shared writes fault, private copies, repeat-lease latency" sh \
	--count '^PASS  ' --min 17 -- sh "$here/lease-gpu.sh"
step "restart on the GPU: a second mount takes over resident files, a held lease and a reader" sh \
	--count '^PASS  ' --min 7 -- env PYTHONPATH="$repo/python" python3 "$here/restart-gpu.py" --bin "$here/gdsfs" \
	--work "$GDSFS_TEST_DIR.restart" --files 4 --size 512MiB
if [ "${GDSFS_CUFILE_SETUP:-0}" = 1 ]; then
	echo "=== test-machine setup: cuFile compat mode for $GDSFS_TEST_DIR"
	sh "$here/cufile-compat.sh" "$GDSFS_TEST_DIR"
	export CUFILE_FORCE_COMPAT_MODE=true GDSFS_REQUIRE_CUFILE=1
	step "cuda backend cuFile" go --skip "TestCuFileStatsChild=$helper" --skip "TestCuFileStatsFakeLibrary=$no_cc" \
		--skip "TestCuFileStatsLevels=$no_cc" --skip "TestCuFileStatsMissingSymbols=$no_cc" -- "$here/cuda.test" -test.v -test.count=1 -test.run 'CuFile'
	step "staging, cuFile path, every byte verified" go -- \
		"$here/gpustaging.test" -test.v -test.count=1 -test.run 'CuFilePath'
	step "lease integrity on CUDA under concurrent rewrites, cuFile path" go -- \
		"$here/gpustaging.test" -test.v -test.count=1 -test.run 'LeaseIntegrityCUDA/compat_mode=off'
	step "auto with cuFile in compat mode picks POSIX (faster) and says why" go -- \
		env GDSFS_EXPECT_AUTO=posix "$here/gpustaging.test" -test.v -test.count=1 -test.run 'AutoPicks'
	step "mount on the GPU, cuFile path (io.compat_mode=off)" sh --count '"sha256":"' --min 1 -- \
		sh "$here/mount-gpu.sh" cufile
else
	summary="$summary
NOT RUN: the cuFile path steps (GDSFS_CUFILE_SETUP=1 runs them after the test-machine setup)"
fi
echo "=== summary$summary"
if [ $fail != 0 ]; then
	echo "GPU TESTS FAILED"
elif [ $skipped != 0 ]; then
	echo "GPU TESTS PASSED; $skipped step(s) did not run here, each skipped as expected (see the summary)"
else
	echo "GPU TESTS PASSED"
fi
exit $fail
