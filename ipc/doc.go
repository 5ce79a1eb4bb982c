// Package ipc is the lease server: consumers on the node ask for a staged
// file over a Unix socket and receive its chunks as file descriptors
// (SCM_RIGHTS) to map: CUDA VMM handles on a GPU, memfds on the host
// backend. The protocol itself (messages, descriptor rules, errno names)
// is package proto; proto/PROTOCOL.md describes it.
//
// It never hands a descriptor to a peer that could not read the file
// itself: the file is opened as the peer (uid and gid from SO_PEERCRED,
// groups from /proc), so the kernel decides, ACLs included. Bytes handed
// to a connection stay counted against the capacity until the connection
// closes, with per-uid bounds on connections, leases and held bytes. One
// connection's bad or slow input never stops another, and closing a
// connection ends everything it held.
//
// Waiting is answered, not polled: a wait request is answered when the
// staging cache says the file changed state (staging.Cache.Subscribe), a
// wait_stat when one of the server's own lease counters changes.
//
// A running server can be handed to a successor daemon (handover.go):
// its listening socket, every connection with its peer's credentials as
// checked at accept, the leases held and the bytes read but not handled,
// the epoch, the lease ids and the counters. Consumers see a pause: what
// they send meanwhile waits in the sockets and is answered by the
// successor.
package ipc
