package access

import (
	"bufio"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Cred is who a request comes from: the uid, gid and supplementary groups
// the kernel checks a file access against.
type Cred struct {
	UID    uint32
	GID    uint32
	Groups []uint32 // supplementary groups
}

func (c Cred) String() string { return fmt.Sprintf("uid %d gid %d", c.UID, c.GID) }

// Daemon is the daemon's own credentials.
func Daemon() Cred {
	return Cred{UID: uint32(os.Geteuid()), GID: uint32(os.Getegid())}
}

// FromPID returns the credentials of a request: uid and gid as the kernel
// reported them (SO_PEERCRED, the FUSE request header), with the
// supplementary groups of process pid from /proc/PID/status. A process
// that cannot be read (it exited, or lives in a PID namespace the daemon
// cannot see: pid 0) keeps no supplementary group: it can only get fewer
// rights than it has, never more.
func FromPID(pid int32, uid, gid uint32) (Cred, error) {
	c := Cred{UID: uid, GID: gid}
	if pid <= 0 {
		return c, fmt.Errorf("groups of pid %d: no such process", pid)
	}
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return c, fmt.Errorf("groups of pid %d: %w", pid, err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		line, ok := strings.CutPrefix(s.Text(), "Groups:")
		if !ok {
			continue
		}
		for _, g := range strings.Fields(line) {
			v, err := strconv.ParseUint(g, 10, 32)
			if err == nil && !slices.Contains(c.Groups, uint32(v)) {
				c.Groups = append(c.Groups, uint32(v))
			}
		}
		return c, nil
	}
	return c, fmt.Errorf("groups of pid %d: no Groups line in /proc/%d/status", pid, pid)
}

// Do runs fn with the file-system credentials of c on the calling
// goroutine's OS thread: fsuid, fsgid and supplementary groups are set for
// that thread alone (raw setfsuid/setfsgid/setgroups, never the
// all-threads variants), so the kernel itself decides every permission fn
// needs, ACLs and masks included. A root daemon loses its file
// capabilities on that thread while it acts for c: the kernel drops the
// file ones (CAP_DAC_OVERRIDE, CAP_FOWNER, ...) with the fsuid change, and
// Do clears the rest of the thread's effective set (CAP_SYS_ADMIN,
// CAP_SETFCAP, CAP_SYS_RESOURCE, ...) so nothing fn does can use a right
// the caller lacks; both come back before the thread is released.
//
// When c is the daemon itself, fn runs as it is. A daemon that is not root
// cannot take another user's identity: fn does not run and the answer is
// EACCES.
func (c Cred) Do(fn func() error) error {
	me := Daemon()
	if c.UID == me.UID && c.GID == me.GID && (me.UID != 0 || c.UID == 0) {
		// The daemon itself (root callers keep root's rights, as they
		// would have on SOURCE directly).
		return fn()
	}
	if me.UID != 0 {
		return fmt.Errorf("%s: a daemon that is not root serves only its own user: %w", c, syscall.EACCES)
	}
	runtime.LockOSThread()
	saved, err := threadGroups()
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	if err := c.enter(); err != nil {
		if restore(saved) == nil {
			runtime.UnlockOSThread()
		}
		// else: the thread keeps an unknown identity; it stays locked to
		// this goroutine and ends with it.
		return err
	}
	caps, err := dropCapabilities()
	if err != nil {
		if restore(saved) == nil {
			runtime.UnlockOSThread()
		}
		return err
	}
	ferr := fn()
	if restoreCapabilities(caps) != nil || restore(saved) != nil {
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

// restore puts the thread back to the daemon's identity.
func restore(groups []uint32) error {
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

// dropCapabilities clears the calling thread's effective capabilities
// (the permitted set stays, so they can be raised again) and returns what
// they were.
func dropCapabilities() ([2]unix.CapUserData, error) {
	var saved [2]unix.CapUserData
	if err := unix.Capget(capsHeader(), &saved[0]); err != nil {
		return saved, fmt.Errorf("capget: %w", err)
	}
	cleared := saved
	cleared[0].Effective, cleared[1].Effective = 0, 0
	if err := unix.Capset(capsHeader(), &cleared[0]); err != nil {
		return saved, fmt.Errorf("capset: %w", err)
	}
	return saved, nil
}

// restoreCapabilities puts back the effective set dropCapabilities saved.
func restoreCapabilities(saved [2]unix.CapUserData) error {
	if err := unix.Capset(capsHeader(), &saved[0]); err != nil {
		return fmt.Errorf("capset: %w", err)
	}
	return nil
}
