package access

import (
	"fmt"
	"os"
	"runtime"
	"syscall"

	"golang.org/x/sys/unix"
)

// Cred is who a request comes from: the uid, gid and supplementary groups
// the kernel checks a file access against, and the effective capabilities
// the caller holds (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER, ...),
// which are what let a uid-0 caller past modes it does not own. A uid alone
// grants nothing: a uid-0 caller without capabilities has only the rights
// of an owner named uid 0.
type Cred struct {
	UID    uint32
	GID    uint32
	Groups []uint32 // supplementary groups
	Caps   uint64   // effective capabilities, bit n for capability n
}

func (c Cred) String() string {
	return fmt.Sprintf("uid %d gid %d caps %#x", c.UID, c.GID, c.Caps)
}

// daemonCaps is the daemon's effective set, read once at start-up on the
// main thread (before any Do changes a thread's set).
var daemonCaps = threadEffective()

// Daemon is the daemon's own credentials.
func Daemon() Cred {
	return Cred{UID: uint32(os.Geteuid()), GID: uint32(os.Getegid()), Caps: daemonCaps}
}

// FromPID returns the credentials of a FUSE request: uid and gid as the
// kernel reported them in the request header (the caller's fsuid and
// fsgid), with the supplementary groups and effective capabilities of
// thread pid read from /proc/PID/status (see procCred: they are taken only
// while that thread's fs ids are the header's and it lives in the daemon's
// user namespace); for a caller with the daemon's ids and every
// capability the daemon has, its capabilities alone, through its pidfd
// (pidfdCaps): Do serves it as the daemon, groups unused. A thread that
// cannot be read (it exited, or lives in a PID namespace the daemon cannot
// see: pid 0) keeps no supplementary group and no capability: it can only
// get fewer rights than it has, never more.
func FromPID(pid int32, uid, gid uint32) (Cred, error) {
	c := Cred{UID: uid, GID: gid}
	if pid <= 0 {
		return c, fmt.Errorf("groups of pid %d: no such process", pid)
	}
	pidfd, err := unix.PidfdOpen(int(pid), pidfdThread)
	if err == unix.EINVAL {
		pidfd, err = unix.PidfdOpen(int(pid), 0) // kernels before 6.9 open no thread
	}
	if err != nil {
		pidfd = -1 // no check that pid was not reused; the fs ids still must match
	} else {
		defer unix.Close(pidfd)
	}
	if me := Daemon(); pidfd >= 0 && uid == me.UID && gid == me.GID {
		// A caller with the daemon's ids and every capability it has (a
		// root job) is served as the daemon itself (Do), whose own groups
		// count: its supplementary groups are not needed, and
		// /proc/TID/status, most of a look-up's cost, is not read.
		if caps, err := pidfdCaps(pid, pidfd, fsIDs, uid, gid); err == nil && caps&me.Caps == me.Caps {
			c.Caps = caps
			return c, nil
		}
	}
	p, err := procCred(pid, pidfd, fsIDs, uid, gid)
	if err != nil {
		return c, err
	}
	c.Groups, c.Caps = p.Groups, p.Caps
	return c, nil
}

// Do runs fn with the credentials of c on the calling goroutine's OS
// thread: fsuid, fsgid and supplementary groups are set for that thread
// alone (raw setfsuid/setfsgid/setgroups, never the all-threads
// variants), and the thread's effective capabilities become those of c
// that the daemon holds, so the kernel itself decides every permission fn
// needs, ACLs, masks and capabilities included. A caller without
// CAP_DAC_OVERRIDE is refused what its ids do not allow, whatever its uid;
// nothing fn does can use a right the caller lacks. The thread's ids and
// capabilities come back before it is released.
//
// When c has the daemon's ids and every capability the daemon has, fn runs
// as it is. A daemon that is not root cannot take another user's identity:
// it serves its own uid and gid only (fn runs as it is); anyone else gets
// EACCES and fn does not run.
func (c Cred) Do(fn func() error) error {
	me := Daemon()
	if me.UID != 0 {
		if c.UID != me.UID || c.GID != me.GID {
			return fmt.Errorf("%s: a daemon that is not root serves only its own user: %w", c, syscall.EACCES)
		}
		return fn()
	}
	if c.UID == me.UID && c.GID == me.GID && c.Caps&me.Caps == me.Caps {
		return fn()
	}
	runtime.LockOSThread()
	saved, err := threadGroups()
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	caps, err := threadCaps()
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	if err := c.enter(); err != nil {
		if restore(saved, caps) == nil {
			runtime.UnlockOSThread()
		}
		// else: the thread keeps an unknown identity; it stays locked to
		// this goroutine and ends with it.
		return err
	}
	if err := keepCapabilities(caps, c.Caps); err != nil {
		if restore(saved, caps) == nil {
			runtime.UnlockOSThread()
		}
		return err
	}
	ferr := fn()
	if restore(saved, caps) != nil {
		// Never hand a thread with another user's identity back to the
		// scheduler: stay locked; the runtime ends the thread with the
		// goroutine.
		return ferr
	}
	runtime.UnlockOSThread()
	return ferr
}

// enter switches the current thread to c. The thread must be locked.
func (c Cred) enter() error {
	groups := make([]uint32, len(c.Groups))
	copy(groups, c.Groups)
	if err := rawSetgroups(groups); err != nil {
		return fmt.Errorf("setgroups for %s: %w", c, err)
	}
	unix.Setfsgid(int(c.GID))
	unix.Setfsuid(int(c.UID))
	// setfsuid and setfsgid report nothing useful on failure: read back.
	if g, _ := unix.SetfsgidRetGid(-1); g != int(c.GID) {
		return fmt.Errorf("setfsgid %d: still %d: %w", c.GID, g, syscall.EPERM)
	}
	if u, _ := unix.SetfsuidRetUid(-1); u != int(c.UID) {
		return fmt.Errorf("setfsuid %d: still %d: %w", c.UID, u, syscall.EPERM)
	}
	return nil
}

// restore puts the thread back to the daemon's capabilities (first: the
// rest needs CAP_SETGID), ids and groups.
func restore(groups []uint32, caps [2]unix.CapUserData) error {
	if err := unix.Capset(capsHeader(), &caps[0]); err != nil {
		return fmt.Errorf("capset: %w", err)
	}
	me := Daemon()
	unix.Setfsuid(int(me.UID))
	unix.Setfsgid(int(me.GID))
	if u, _ := unix.SetfsuidRetUid(-1); u != int(me.UID) {
		return fmt.Errorf("restore fsuid: %w", syscall.EPERM)
	}
	if g, _ := unix.SetfsgidRetGid(-1); g != int(me.GID) {
		return fmt.Errorf("restore fsgid: %w", syscall.EPERM)
	}
	return rawSetgroups(groups)
}

// threadGroups returns the calling thread's supplementary groups.
func threadGroups() ([]uint32, error) {
	n, _, errno := unix.RawSyscall(unix.SYS_GETGROUPS, 0, 0, 0)
	if errno != 0 {
		return nil, fmt.Errorf("getgroups: %w", errno)
	}
	if n == 0 {
		return nil, nil
	}
	g := make([]uint32, n)
	n, _, errno = unix.RawSyscall(unix.SYS_GETGROUPS, n, uintptr(unsafePointer(g)), 0)
	if errno != 0 {
		return nil, fmt.Errorf("getgroups: %w", errno)
	}
	return g[:n], nil
}

// rawSetgroups sets the calling thread's supplementary groups only (the
// syscall package's Setgroups changes every thread of the process).
func rawSetgroups(g []uint32) error {
	var p uintptr
	if len(g) > 0 {
		p = uintptr(unsafePointer(g))
	}
	_, _, errno := unix.RawSyscall(unix.SYS_SETGROUPS, uintptr(len(g)), p, 0)
	runtime.KeepAlive(g)
	if errno != 0 {
		return errno
	}
	return nil
}

// capsHeader addresses the calling thread (pid 0).
func capsHeader() *unix.CapUserHeader {
	return &unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
}

// threadCaps returns the calling thread's capability sets.
func threadCaps() ([2]unix.CapUserData, error) {
	var d [2]unix.CapUserData
	if err := unix.Capget(capsHeader(), &d[0]); err != nil {
		return d, fmt.Errorf("capget: %w", err)
	}
	return d, nil
}

// threadEffective is the calling thread's effective set (none if it
// cannot be read).
func threadEffective() uint64 {
	d, err := threadCaps()
	if err != nil {
		return 0
	}
	return uint64(d[0].Effective) | uint64(d[1].Effective)<<32
}

// keepCapabilities sets the calling thread's effective set to the part of
// saved's effective set that is in keep (the permitted set stays, so the
// rest can be raised again).
func keepCapabilities(saved [2]unix.CapUserData, keep uint64) error {
	d := saved
	d[0].Effective &= uint32(keep)
	d[1].Effective &= uint32(keep >> 32)
	if err := unix.Capset(capsHeader(), &d[0]); err != nil {
		return fmt.Errorf("capset: %w", err)
	}
	return nil
}
