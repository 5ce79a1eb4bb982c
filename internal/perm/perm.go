// Package perm decides whether a caller (uid, gids) may read a file, from
// the file's owner, group and mode bits, as the kernel would without ACLs.
// The control files and the lease socket use it so a caller can never obtain
// through gdsfs bytes it could not read directly.
package perm

import (
	"bufio"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
)

// Cred is who is asking.
type Cred struct {
	UID  uint32
	GIDs []uint32 // primary first, then supplementary
}

// CanRead reports whether cred may read a file with attributes st.
// Root reads everything, as CAP_DAC_OVERRIDE allows.
func CanRead(st *syscall.Stat_t, cred Cred) bool {
	return cred.UID == 0 || allowed(st, cred, 0o4)
}

// CanSearch reports whether cred may look up names in a directory with
// attributes st. Root may if any execute bit is set.
func CanSearch(st *syscall.Stat_t, cred Cred) bool {
	if cred.UID == 0 {
		return st.Mode&0o111 != 0
	}
	return allowed(st, cred, 0o1)
}

// allowed applies the owner, group or other bits of st for bit (4 read,
// 1 execute), as the kernel picks exactly one class.
func allowed(st *syscall.Stat_t, cred Cred, bit uint32) bool {
	switch {
	case cred.UID == st.Uid:
		return st.Mode&(bit<<6) != 0
	case slices.Contains(cred.GIDs, st.Gid):
		return st.Mode&(bit<<3) != 0
	default:
		return st.Mode&bit != 0
	}
}

// ForPID returns the credentials of a process: its effective uid, and its
// effective gid and supplementary groups from /proc/PID/status. uid and gid
// (from SO_PEERCRED or the FUSE request) are trusted over /proc, which only
// adds the supplementary groups.
func ForPID(pid int32, uid, gid uint32) (Cred, error) {
	cred := Cred{UID: uid, GIDs: []uint32{gid}}
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return cred, fmt.Errorf("groups of pid %d: %w", pid, err)
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
			if err == nil && !slices.Contains(cred.GIDs, uint32(v)) {
				cred.GIDs = append(cred.GIDs, uint32(v))
			}
		}
		return cred, nil
	}
	return cred, fmt.Errorf("groups of pid %d: no Groups line", pid)
}
