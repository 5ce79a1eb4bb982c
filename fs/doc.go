// Package fs is the FUSE side of gdsfs: a node tree mirroring SOURCE,
// kernel passthrough or daemon-served reads, the virtual .gdsfs/ control
// directory, and the user.gdsfs.* xattrs.
//
// A root daemon serving other users must never be a way around the
// kernel's own checks, so fs never acts on SOURCE by path as root. Every
// request resolves its node's path beneath SOURCE's directory descriptor
// (internal/access: openat2 with RESOLVE_BENEATH, no symbolic link on a
// path the kernel already walked), checks that the path still names the
// node's inode (ESTALE otherwise: the kernel looks the name up again), and
// acts on the descriptor it resolved (fchmodat2, fchownat, utimensat with
// AT_EMPTY_PATH; ftruncate on a descriptor opened for writing; mkdirat,
// symlinkat, linkat, renameat2, unlinkat in the resolved directory) with
// the caller's fsuid, fsgid and supplementary groups, so the kernel decides
// every permission, ACLs included. The kernel checks ACLs on the mount too
// (FUSE_POSIX_ACL), and the caller's umask is applied once (umask.go).
//
// Nodes stay thin: each kernel call becomes one or two calls on the backing
// file or on the Stager. fs never waits for staging: it tells the Stager
// of opens, closes and changes made through the mount. It never writes to
// SOURCE unless fuse.read_only is false.
//
// The mount outlives the daemon serving it: a successor takes the FUSE
// connection over (Handoff, Adopt; handover.go, adopt.go, liveconn.go),
// so node ids are the daemon's choice and a function of the file alone
// (nodeids.go), and umaskFS keeps what the kernel holds (kernelrefs.go).
// A request naming a node id or handle the daemon does not hold answers
// ESTALE or EBADF; it must never reach go-fuse's node layer, which panics.
package fs
