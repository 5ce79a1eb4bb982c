package check

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// dirFacts are what the checked directory's filesystem offers.
type dirFacts struct {
	Dir
	fstype  string
	block   bool // a block device backs it
	udev    bool // the udev database has an entry for it
	oDirect bool
}

func inspectDir(dir string) dirFacts {
	var d dirFacts
	d.Path = dir
	mnt, fstype, source := mountOf(dir)
	d.fstype = fstype
	d.Filesystem = unknown("not found in /proc/self/mountinfo")
	if fstype != "" {
		d.Filesystem = fmt.Sprintf("%s from %s, mounted at %s", fstype, source, mnt)
	}
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		d.BlockDevice, d.UdevEntry = unknown(err.Error()), unknown(err.Error())
	} else {
		majmin := fmt.Sprintf("%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev))
		if _, err := os.Stat("/sys/dev/block/" + majmin); err == nil {
			d.block = true
			d.BlockDevice = majmin
			entry := "/run/udev/data/b" + majmin
			_, err := os.Stat(entry)
			d.udev = err == nil
			d.UdevEntry = map[bool]string{true: "present (" + entry + ")", false: "missing (" + entry + ")"}[d.udev]
		} else {
			d.BlockDevice = "none (" + majmin + " is not a block device: " + fstype + ")"
			d.UdevEntry = "not applicable (no block device)"
		}
	}
	d.oDirect, d.ODirect = probeODirect(dir)
	return d
}

// mountOf finds the mount holding dir: its mount point, type and source.
func mountOf(dir string) (mnt, fstype, source string) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", "", ""
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	s.Buffer(make([]byte, 64<<10), 1<<20)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) < 10 {
			continue
		}
		mp := strings.ReplaceAll(fields[4], `\040`, " ")
		if dir != mp && !strings.HasPrefix(dir, strings.TrimSuffix(mp, "/")+"/") {
			continue
		}
		if len(mp) < len(mnt) {
			continue
		}
		for i, x := range fields {
			if x == "-" && i+2 < len(fields) {
				mnt, fstype, source = mp, fields[i+1], fields[i+2]
			}
		}
	}
	return mnt, fstype, source
}

// probeODirect opens a new file in dir with O_DIRECT.
func probeODirect(dir string) (bool, string) {
	f, err := os.CreateTemp(dir, ".gdsfs-check-odirect-")
	if err != nil {
		return false, unknown("cannot create a file: " + err.Error())
	}
	name := f.Name()
	f.Close()
	defer os.Remove(name)
	g, err := os.OpenFile(name, os.O_RDONLY|syscall.O_DIRECT, 0)
	if err != nil {
		if errors.Is(err, syscall.EINVAL) {
			return false, "refused (EINVAL): the filesystem does not do O_DIRECT"
		}
		return false, "refused: " + err.Error()
	}
	g.Close()
	return true, "accepted"
}

var allowCompat = regexp.MustCompile(`"allow_compat_mode"\s*:\s*(true|false)`)

// cufileJSON says which cufile.json cuFile reads and its allow_compat_mode.
func cufileJSON() (text string, compatAllowed bool) {
	path, from := "/etc/cufile.json", "default path"
	if p := os.Getenv("CUFILE_ENV_PATH_JSON"); p != "" {
		path, from = p, "CUFILE_ENV_PATH_JSON"
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Sprintf("absent (%s, %s): cuFile's built-in defaults apply", path, from), true
	}
	if err != nil {
		return unknown(path + ": " + err.Error()), true
	}
	m := allowCompat.FindSubmatch(b)
	if m == nil {
		return fmt.Sprintf("%s (%s): allow_compat_mode not set (default true)", filepath.Clean(path), from), true
	}
	return fmt.Sprintf("%s (%s): allow_compat_mode %s", filepath.Clean(path), from, m[1]), string(m[1]) == "true"
}
