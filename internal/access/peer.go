package access

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// pidfdThread is PIDFD_THREAD (O_EXCL): a pidfd for one thread (Linux 6.9).
const pidfdThread = unix.O_EXCL

// Peer returns the credentials of the process at the other end of the
// connected Unix socket fd, as the kernel recorded them when it connected:
// uid and gid (SO_PEERCRED: its effective ids), supplementary groups
// (SO_PEERGROUPS), and its effective capabilities, those of the process
// the socket's pidfd names (SO_PEERPIDFD; pidfd_open of SO_PEERCRED's pid
// before Linux 6.5), read by capget with its ids from the pidfd
// (PIDFD_GET_INFO; from /proc/PID/status before Linux 6.13). They are
// taken only while that process's effective ids are SO_PEERCRED's, it
// lives in the daemon's user namespace, and its pidfd shows it alive after
// the read (so the pid was not reused meanwhile): otherwise the peer has
// none. A peer whose uid is not 0 has none either (see below). Only a
// failed SO_PEERCRED is an error.
func Peer(fd int) (Cred, error) {
	uc, err := unix.GetsockoptUcred(fd, unix.SOL_SOCKET, unix.SO_PEERCRED)
	if err != nil {
		return Cred{UID: ^uint32(0), GID: ^uint32(0)}, fmt.Errorf("SO_PEERCRED: %w", err)
	}
	c := Cred{UID: uc.Uid, GID: uc.Gid}
	if g, err := peerGroups(fd); err == nil {
		c.Groups = g
	}
	if uc.Uid != 0 {
		// Capabilities are read from the peer process as it is now, not
		// as it was at connect: a process that connected and then ran a
		// program with file capabilities (same ids) would pass for that
		// program. Only a uid-0 peer's capabilities count; a uid-0
		// process that can regain capabilities by exec has them anyway.
		return c, nil
	}
	pidfd, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_PEERPIDFD)
	if err == unix.ENOPROTOOPT && uc.Pid > 0 {
		// Before Linux 6.5. (Any other error, ESRCH for a peer that
		// exited, must not lead to a pid that may name another process.)
		pidfd, err = unix.PidfdOpen(int(uc.Pid), 0)
	}
	if err != nil {
		return c, nil // no pidfd: nothing proves whose /proc entry it would be
	}
	defer unix.Close(pidfd)
	caps, err := pidfdCaps(uc.Pid, pidfd, effectiveIDs, uc.Uid, uc.Gid)
	if errors.Is(err, errNoPidfdInfo) {
		var p Cred
		p, err = procCred(uc.Pid, pidfd, effectiveIDs, uc.Uid, uc.Gid)
		caps = p.Caps
	}
	if err == nil {
		c.Caps = caps
	}
	return c, nil
}

// errNoPidfdInfo: the kernel answers no PIDFD_GET_INFO with credentials
// (before Linux 6.13).
var errNoPidfdInfo = errors.New("PIDFD_GET_INFO with credentials is not supported")

// pidfdCaps is procCred's answer on capabilities without reading
// /proc/PID/status, which costs more than the rest of a connection's
// setup or of a FUSE look-up: the ids in column ids (effectiveIDs or
// fsIDs) of the process or thread pidfd names (PIDFD_GET_INFO) must be uid
// and gid before and after its capabilities are read (capget of pid), it
// must live in the daemon's user namespace, and pidfd must still name a
// live process after the reads (so pid was not reused meanwhile).
// errNoPidfdInfo where the kernel cannot say.
func pidfdCaps(pid int32, pidfd int, ids int, uid, gid uint32) (uint64, error) {
	idsHold := func() error {
		info := unix.PidfdInfo{Mask: unix.PIDFD_INFO_CREDS}
		err := unix.IoctlPidfdInfo(pidfd, &info)
		switch {
		case err == unix.ENOTTY || err == unix.EINVAL || err == unix.EOPNOTSUPP:
			return errNoPidfdInfo
		case err != nil:
			return fmt.Errorf("PIDFD_GET_INFO of pid %d: %w", pid, err)
		case info.Mask&unix.PIDFD_INFO_CREDS == 0:
			return errNoPidfdInfo
		}
		u, g := info.Euid, info.Egid
		if ids == fsIDs {
			u, g = info.Fsuid, info.Fsgid
		}
		if u != uid || g != gid {
			return fmt.Errorf("pid %d: its ids (%d, %d) are no longer uid %d gid %d", pid, u, g, uid, gid)
		}
		return nil
	}
	if err := idsHold(); err != nil {
		return 0, err
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3, Pid: pid}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return 0, fmt.Errorf("capget of pid %d: %w", pid, err)
	}
	caps := uint64(data[0].Effective) | uint64(data[1].Effective)<<32
	if caps != 0 {
		same, err := sameUserNS(pid)
		if err != nil {
			return 0, err
		}
		if !same {
			caps = 0
		}
	}
	if err := idsHold(); err != nil {
		return 0, err
	}
	if err := unix.PidfdSendSignal(pidfd, 0, nil, 0); err != nil {
		return 0, fmt.Errorf("pid %d exited while its capabilities were read: %w", pid, err)
	}
	return caps, nil
}

// peerGroups reads SO_PEERGROUPS: the supplementary groups the peer had
// when it connected.
func peerGroups(fd int) ([]uint32, error) {
	g := make([]uint32, 64)
	for {
		n := uint32(4 * len(g))
		_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_SOCKET, unix.SO_PEERGROUPS,
			uintptr(unsafe.Pointer(&g[0])), uintptr(unsafe.Pointer(&n)), 0)
		switch {
		case e == unix.ERANGE && int(n) > 4*len(g):
			g = make([]uint32, n/4)
			continue
		case e != 0:
			return nil, fmt.Errorf("SO_PEERGROUPS: %w", e)
		}
		return g[:n/4], nil
	}
}

// Which ids of /proc/PID/status's Uid and Gid lines (real, effective,
// saved, fs) procCred compares.
const (
	effectiveIDs = 1
	fsIDs        = 3
)

// procCred reads the supplementary groups and effective capabilities of
// pid from /proc/PID/status, and returns them only if the ids in column
// ids of its Uid and Gid lines are uid and gid, pid lives in the daemon's
// user namespace (capabilities of another namespace grant nothing here),
// and pidfd (-1: none) still names a live process after the read.
func procCred(pid int32, pidfd int, ids int, uid, gid uint32) (Cred, error) {
	var c Cred
	lines, err := statusLines(pid, "Uid:", "Gid:", "Groups:", "CapEff:")
	if err != nil {
		return c, err
	}
	if !idIs(lines["Uid:"], ids, uid) || !idIs(lines["Gid:"], ids, gid) {
		return c, fmt.Errorf("pid %d: its ids (Uid:%s Gid:%s) are no longer uid %d gid %d", pid, lines["Uid:"], lines["Gid:"], uid, gid)
	}
	for _, g := range strings.Fields(lines["Groups:"]) {
		v, err := strconv.ParseUint(g, 10, 32)
		if err == nil && !slices.Contains(c.Groups, uint32(v)) {
			c.Groups = append(c.Groups, uint32(v))
		}
	}
	caps, err := strconv.ParseUint(strings.TrimSpace(lines["CapEff:"]), 16, 64)
	if err != nil {
		return c, fmt.Errorf("pid %d: CapEff %q: %w", pid, lines["CapEff:"], err)
	}
	if caps != 0 {
		same, err := sameUserNS(pid)
		if err != nil {
			return c, err
		}
		if !same {
			caps = 0
		}
	}
	c.Caps = caps
	if pidfd >= 0 {
		if err := unix.PidfdSendSignal(pidfd, 0, nil, 0); err != nil {
			return Cred{}, fmt.Errorf("pid %d exited while its status was read: %w", pid, err)
		}
	}
	return c, nil
}

// statusLines returns the values of the named lines of /proc/PID/status.
func statusLines(pid int32, names ...string) (map[string]string, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return nil, fmt.Errorf("credentials of pid %d: %w", pid, err)
	}
	defer f.Close()
	out := map[string]string{}
	s := bufio.NewScanner(f)
	for s.Scan() {
		for _, n := range names {
			if v, ok := strings.CutPrefix(s.Text(), n); ok {
				out[n] = v
			}
		}
	}
	for _, n := range names {
		if _, ok := out[n]; !ok {
			return nil, fmt.Errorf("credentials of pid %d: no %s line in /proc/%d/status", pid, n, pid)
		}
	}
	return out, nil
}

// idIs says whether column i of a Uid or Gid line is id.
func idIs(line string, i int, id uint32) bool {
	f := strings.Fields(line)
	return len(f) == 4 && f[i] == strconv.FormatUint(uint64(id), 10)
}

// ownUserNS is the daemon's user namespace (a process of several threads
// cannot move to another).
var ownUserNS = sync.OnceValues(func() (unix.Stat_t, error) {
	var st unix.Stat_t
	if err := unix.Stat("/proc/self/ns/user", &st); err != nil {
		return st, fmt.Errorf("own user namespace: %w", err)
	}
	return st, nil
})

// sameUserNS says whether pid lives in the daemon's user namespace.
func sameUserNS(pid int32) (bool, error) {
	mine, err := ownUserNS()
	if err != nil {
		return false, err
	}
	var theirs unix.Stat_t
	if err := unix.Stat(fmt.Sprintf("/proc/%d/ns/user", pid), &theirs); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return false, fmt.Errorf("pid %d: gone: %w", pid, err)
		}
		return false, fmt.Errorf("user namespace of pid %d: %w", pid, err)
	}
	return mine.Dev == theirs.Dev && mine.Ino == theirs.Ino, nil
}
