// Package gputest verifies staging on a real GPU: every staged byte is
// copied back to the host and compared with the file, on the POSIX path
// and on the cuFile path, and io.compat_mode=auto is checked to pick and
// report the path the platform allows. Without a GPU the tests skip with
// the reason; with GDSFS_REQUIRE_GPU=1 they fail instead.
//
// Environment: GDSFS_TEST_DIR (where test files are written; must be a disk
// filesystem for cuFile), GDSFS_GPU_SIZES (comma-separated sizes, default
// "1KiB,1MiB+1,7MiB+13,1GiB,4GiB"), GDSFS_REQUIRE_CUFILE=1 (a refused
// cuFile registration fails instead of skipping), GDSFS_EXPECT_AUTO
// ("posix" or "cufile": the path auto must pick on this machine).
package gputest
