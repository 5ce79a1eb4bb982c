// Package mountinfo reads /proc/self/mountinfo and /proc to tell whether a
// path is a mount point, of which type, who uses it, and unmounts gdsfs.
package mountinfo

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// MountedAt reports whether path is a mount point, and its filesystem type,
// from /proc/self/mountinfo.
func MountedAt(path string) (fstype string, ok bool) {
	fstype, _, ok = at(path)
	return fstype, ok
}

// FUSEConnection is the FUSE connection number of the mount on path
// (its device's minor: /sys/fs/fuse/connections/N), from
// /proc/self/mountinfo, touching nothing on the mount itself (whose
// daemon may not answer).
func FUSEConnection(path string) (int, error) {
	fstype, dev, ok := at(path)
	if !ok || !strings.HasPrefix(fstype, "fuse") {
		return 0, fmt.Errorf("%s is not a FUSE mount point", path)
	}
	_, minor, found := strings.Cut(dev, ":")
	n, err := strconv.Atoi(minor)
	if !found || err != nil {
		return 0, fmt.Errorf("%s: device %q in mountinfo", path, dev)
	}
	return n, nil
}

// at finds the visible mount on path: its type and maj:min.
func at(path string) (fstype, dev string, ok bool) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", "", false
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	s.Buffer(make([]byte, 64<<10), 1<<20)
	for s.Scan() {
		// id parent maj:min root mountpoint options... - fstype source superopts
		fields := strings.Fields(s.Text())
		if len(fields) < 5 || unescapeMountinfo(fields[4]) != path {
			continue
		}
		dev = fields[2]
		for i, f := range fields {
			if f == "-" && i+1 < len(fields) {
				fstype = fields[i+1]
			}
		}
		ok = true // keep scanning: the last mount on a path is the visible one
	}
	return fstype, dev, ok
}

// unescapeMountinfo undoes the octal escapes (\040 for space) of mountinfo.
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			v := (int(s[i+1]-'0') << 6) | (int(s[i+2]-'0') << 3) | int(s[i+3]-'0')
			b.WriteByte(byte(v))
			i += 3
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// Users lists the processes holding files, or their working directory,
// under mnt ("pid 42 (python3)"), so a busy unmount can say who.
func Users(mnt string) []string {
	procs, _ := os.ReadDir("/proc")
	var out []string
	self := strconv.Itoa(os.Getpid())
	for _, p := range procs {
		pid := p.Name()
		if pid == self || pid[0] < '0' || pid[0] > '9' {
			continue
		}
		if usesPath("/proc/"+pid, mnt) {
			comm, _ := os.ReadFile("/proc/" + pid + "/comm")
			out = append(out, fmt.Sprintf("pid %s (%s)", pid, strings.TrimSpace(string(comm))))
		}
	}
	return out
}

func usesPath(proc, mnt string) bool {
	under := func(link string) bool {
		t, err := os.Readlink(link)
		return err == nil && (t == mnt || strings.HasPrefix(t, mnt+"/"))
	}
	if under(proc+"/cwd") || under(proc+"/root") {
		return true
	}
	fds, _ := os.ReadDir(proc + "/fd")
	for _, fd := range fds {
		if under(proc + "/fd/" + fd.Name()) {
			return true
		}
	}
	return false
}

// Unmount unmounts mnt: by syscall as root, with fusermount otherwise. lazy
// detaches the mount now and lets it go when the last file closes. A busy
// mount's error names the processes using it.
func Unmount(mnt string, lazy bool) error {
	fstype, ok := MountedAt(mnt)
	if !ok {
		return fmt.Errorf("%s: not a mount point", mnt)
	}
	if fstype != "fuse.gdsfs" {
		return fmt.Errorf("%s: a %s mount, not gdsfs", mnt, fstype)
	}
	var err error
	if os.Geteuid() == 0 {
		flags := 0
		if lazy {
			flags = unix.MNT_DETACH
		}
		err = unix.Unmount(mnt, flags)
	} else {
		err = fusermountUnmount(mnt, lazy)
	}
	if errors.Is(err, unix.EBUSY) {
		return Busy(mnt)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", mnt, err)
	}
	return nil
}

func fusermountUnmount(mnt string, lazy bool) error {
	bin, err := exec.LookPath("fusermount3")
	if err != nil {
		if bin, err = exec.LookPath("fusermount"); err != nil {
			return errors.New("not root and no fusermount3 or fusermount on PATH")
		}
	}
	args := []string{"-u", mnt}
	if lazy {
		args = []string{"-u", "-z", mnt}
	}
	out, err := exec.Command(bin, args...).CombinedOutput()
	if err != nil {
		if strings.Contains(string(out), "busy") {
			return unix.EBUSY
		}
		return fmt.Errorf("%s: %s", bin, strings.TrimSpace(string(out)))
	}
	return nil
}

// Busy is the error for a mount that cannot be unmounted: it names the
// processes using it.
func Busy(mnt string) error {
	users := Users(mnt)
	if len(users) == 0 {
		users = []string{"unknown processes"}
	}
	return fmt.Errorf("%s: busy, in use by %s; close those files or unmount with --lazy", mnt, strings.Join(users, ", "))
}

// Root finds the gdsfs mount holding path: the nearest directory above it
// that is a mount point of type fuse.gdsfs. It returns that mount point and
// path relative to it. Symbolic links in path's directory are resolved.
func Root(path string) (mnt, rel string, err error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", "", err
	}
	if dir, err := filepath.EvalSymlinks(filepath.Dir(abs)); err == nil {
		abs = filepath.Join(dir, filepath.Base(abs))
	}
	for dir := abs; ; dir = filepath.Dir(dir) {
		if fstype, ok := MountedAt(dir); ok && fstype == "fuse.gdsfs" {
			r, _ := filepath.Rel(dir, abs)
			return dir, r, nil
		}
		if dir == "/" {
			return "", "", fmt.Errorf("%s: not under a gdsfs mount", path)
		}
	}
}
