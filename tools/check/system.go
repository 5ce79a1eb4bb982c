package check

import (
	"fmt"
	"os"
	"os/exec"

	"golang.org/x/sys/unix"
)

func system() System {
	var s System
	var u unix.Utsname
	s.Kernel = unknown("uname failed")
	if unix.Uname(&u) == nil {
		s.Kernel = unix.ByteSliceToString(u.Release[:])
	}
	s.DevFuse = "usable"
	if f, err := os.OpenFile("/dev/fuse", os.O_RDWR, 0); err != nil {
		s.DevFuse = "unusable: " + err.Error()
	} else {
		f.Close()
	}
	root := os.Geteuid() == 0
	s.Root = map[bool]string{true: "yes", false: "no (mounting needs root, or fusermount3)"}[root]
	s.Fusermount = "not found (root mounts by syscall; others need fusermount3)"
	for _, name := range []string{"fusermount3", "fusermount"} {
		if p, err := exec.LookPath(name); err == nil {
			s.Fusermount = p
			break
		}
	}
	s.Passthrough = passthroughSupport(s.Kernel, root)
	return s
}

// passthroughSupport says whether FUSE passthrough can work: Linux >= 6.9
// and CAP_SYS_ADMIN (a mount settles it for sure; see stats "passthrough").
func passthroughSupport(kernel string, root bool) string {
	var major, minor int
	if _, err := fmt.Sscanf(kernel, "%d.%d", &major, &minor); err != nil {
		return unknown("kernel version " + kernel + " not understood")
	}
	switch {
	case major < 6 || (major == 6 && minor < 9):
		return "no: kernel " + kernel + " < 6.9"
	case !root:
		return "no: needs root (CAP_SYS_ADMIN)"
	default:
		return "yes (kernel >= 6.9, root)"
	}
}
