// Package client is the Go consumer side of gdsfs leases: Open(path) finds
// the gdsfs mount holding path (the nearest mount point above it, bind
// mounts included, as the Python client does), asks its daemon for the
// staged file over the lease socket, and maps the chunks it receives into
// one contiguous range: a CUDA device pointer (VMM import through
// libcuda.so.1, loaded at run time without cgo) on a GPU, a host mapping
// on the host backend. Shared-mode leases are mapped read-only. A path
// under no gdsfs mount is never sent, and before anything is sent the
// socket's listener (SO_PEERCRED) must be the mount's owner
// (UntrustedError otherwise; docs/security.md).
//
// Leases go over a small pool of connections per daemon (a fresh lease on
// one no other request is using, a new one where all are busy; a repeat
// lease on the one holding its mapping): the daemon counts a file's bytes
// against its capacity until the client drops them (after unmapping) or
// the connection closes, which happens once it holds nothing and serves
// no request. Closing a lease does not wait for the daemon's answer (read
// before the next request, or once 64 are unread). Where the
// daemon allows it, a closed lease's mapping is kept, so the next Open of
// an unchanged file is one round trip with no descriptors.
//
// Wait and WaitStat block until the daemon says a file reached a state or
// a lease counter a value (the daemon answers on the change; nothing is
// polled).
//
// The package builds with CGO_ENABLED=0 and links neither the daemon
// (staging, gpu) nor a logging library: only proto, client/chunkmap (the
// mapping of chunks, which the gpu backends' tests use too), x/sys and
// purego.
package client
