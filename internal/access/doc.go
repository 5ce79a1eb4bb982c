// Package access is how a root daemon touches SOURCE on someone else's
// behalf: every path is resolved beneath SOURCE's directory descriptor
// (openat2 with RESOLVE_BENEATH and RESOLVE_NO_MAGICLINKS; no absolute or
// escaping symbolic link is followed), and every access that depends on
// who asks runs with the asker's fsuid, fsgid and supplementary groups on
// a locked OS thread, so the kernel decides permissions (ACLs, masks and
// capabilities included).
//
// It must never decide a permission itself from mode bits: there is no
// hand-written permission logic here or anywhere that uses it.
package access
