package staging

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
