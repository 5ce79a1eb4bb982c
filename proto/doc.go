// Package proto is the gdsfs lease protocol: the messages a consumer and
// the daemon exchange on the lease socket (JSON lines), the rules for the
// chunk descriptors that ride on answers (SCM_RIGHTS), and the errno names
// errors carry. PROTOCOL.md beside this file is its description; the
// transcripts under testdata/ are replayed by the server's tests and by both
// clients' tests.
//
// It is a leaf: no cgo, no logging, nothing of the daemon (staging, gpu).
// The server (package ipc) and the Go client (package client) import it;
// the Python client (python/gdsfs/_proto.py) follows PROTOCOL.md.
package proto
