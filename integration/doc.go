// Package integration holds the tests that really mount: they build the
// gdsfs binary, mount it over temporary SOURCE trees and check what real
// tools, the control files and the lease clients see. They need root and
// /dev/fuse (make test); without them they skip with the reason.
package integration
