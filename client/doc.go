// Package client is the Go consumer side of gdsfs leases: Open(path) finds
// the mount holding path, asks its daemon for the staged file over the lease
// socket, and maps the chunks it receives into one contiguous range: a CUDA
// device pointer (VMM import) on a GPU, a read-only host mapping on the host
// backend. The lease pins the file until Close or until the process exits.
package client
