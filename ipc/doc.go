// Package ipc is the lease server: consumers on the node ask for a staged
// file over a Unix socket (JSON lines) and receive its chunks as file
// descriptors (SCM_RIGHTS) to map: CUDA VMM handles on a GPU, memfds on the
// host backend.
//
// It never hands a descriptor to a peer that could not read the backing
// file itself (uid and groups from SO_PEERCRED and /proc), never lets one
// connection's bad input stop another, and ends every lease of a
// connection when it closes.
package ipc
