// Package fs is the FUSE side of gdsfs: a node tree mirroring SOURCE
// (go-fuse's loopback nodes), kernel passthrough or daemon-served reads, the
// virtual .gdsfs/ control directory, and the user.gdsfs.* xattrs.
//
// Nodes stay thin: each kernel call becomes one or two calls on the backing
// file or on the Stager. fs never waits for staging: an open only tells the
// Stager a file was opened. It never writes to SOURCE unless fuse.read_only
// is false.
package fs
