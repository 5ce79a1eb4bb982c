package staging

import "os"

// Every unlock of Cache.mu in the package's tests checks the invariants.
func init() { checkOnUnlock = true }

// The package's test helpers, for its external tests (package
// staging_test, which may import what imports staging, such as
// internal/config).
var (
	DropCache   = dropCache
	CheckStaged = checkStaged
	RandomBytes = randomBytes
)

// ResidentShare is residentShare: the share of a sample of f's pages in
// the page cache.
func ResidentShare(f *os.File, size int64) float64 { return residentShare(f, size) }
