package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/gdsfs/gdsfs/daemon/config"
)

// The mount helper: mount(8) runs /sbin/mount.fuse.gdsfs (a link to gdsfs,
// `make install`) for `mount -t fuse.gdsfs SOURCE MOUNTPOINT -o OPTIONS` and
// for /etc/fstab lines of type fuse.gdsfs, as
//
//	mount.fuse.gdsfs SOURCE MOUNTPOINT [-sfnv] [-o OPTIONS] [-t TYPE]
//
// and mount.fuse (fuse3) runs `gdsfs SOURCE MOUNTPOINT -o OPTIONS` for type
// fuse with SOURCE "gdsfs#/path". OPTIONS are gdsfs config keys
// (key.sub=value, as --set) and a few standard words; the mount is started
// with --daemon, so the helper returns once it is served.

// helperArgs reports whether args (os.Args) are a mount helper call.
func helperArgs(args []string) bool {
	switch filepath.Base(args[0]) {
	case "mount.fuse.gdsfs", "mount.gdsfs":
		return true
	}
	// No command has a slash in its name: a path first is mount.fuse's call.
	return len(args) > 2 && strings.ContainsRune(args[1], '/') && !strings.HasPrefix(args[1], "-")
}

// helperCall is a parsed helper command line.
type helperCall struct {
	req     mountRequest
	fake    bool // -f: check everything, mount nothing
	verbose bool // -v: say what is run
}

// ignoredOptions are mount(8)'s own options and kernel flags that mean
// nothing to gdsfs; they are accepted and dropped. rw is the default that
// mount passes for every line: it leaves fuse.read_only as configured.
var ignoredOptions = map[string]bool{
	"rw": true, "defaults": true, "auto": true, "noauto": true, "_netdev": true, "nofail": true,
	"user": true, "users": true, "nouser": true, "owner": true, "group": true,
	"sync": true, "async": true, "dirsync": true, "atime": true, "noatime": true, "relatime": true,
	"norelatime": true, "strictatime": true, "nostrictatime": true, "lazytime": true, "nolazytime": true,
	"diratime": true, "nodiratime": true, "mand": true, "nomand": true, "silent": true, "loud": true,
	"iversion": true, "noiversion": true, "default_permissions": true,
}

// flagOptions are kernel mount flags gdsfs applies (fuse.mount_flags).
var flagOptions = map[string]bool{"noexec": true, "nosuid": true, "nodev": true}

var ignoredPrefixes = []string{"x-", "comment=", "fsname=", "subtype=", "helper=", "context=", "fscontext=", "defcontext=", "rootcontext="}

// parseHelper reads a helper command line (args without the program name).
func parseHelper(args []string) (helperCall, error) {
	var h helperCall
	var pos, opts []string
	sloppy := false
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "-o" || a == "-t" || a == "-N":
			if i+1 == len(args) {
				return h, usageError{fmt.Errorf("%s: wants a value", a)}
			}
			i++
			switch a {
			case "-o":
				opts = append(opts, args[i])
			case "-N":
				return h, usageError{errors.New("-N: mounting into another namespace is not supported; run gdsfs in it")}
			}
		case strings.HasPrefix(a, "-o"):
			opts = append(opts, a[2:])
		case strings.HasPrefix(a, "-") && len(a) > 1:
			for _, f := range a[1:] {
				switch f {
				case 'f':
					h.fake = true
				case 'v':
					h.verbose = true
				case 's':
					sloppy = true
				case 'n':
				default:
					return h, usageError{fmt.Errorf("-%c: unknown flag (mount helper flags: -f -n -s -v -o OPTIONS)", f)}
				}
			}
		default:
			pos = append(pos, a)
		}
	}
	if len(pos) != 2 {
		return h, usageError{fmt.Errorf("want SOURCE MOUNTPOINT [-o OPTIONS], got %d arguments %q", len(pos), pos)}
	}
	h.req = mountRequest{source: strings.TrimPrefix(pos[0], "gdsfs#"), mountpoint: pos[1], daemon: true}
	var flags []string
	for _, o := range opts {
		if err := h.req.addOptions(o, sloppy, &flags); err != nil {
			return h, usageError{err}
		}
	}
	if len(flags) > 0 {
		h.req.sets = append(h.req.sets, "fuse.mount_flags=["+strings.Join(flags, ",")+"]")
	}
	return h, nil
}

// addOptions maps one -o string onto the request; kernel mount flags are
// added to flags.
func (r *mountRequest) addOptions(s string, sloppy bool, flags *[]string) error {
	for _, o := range splitOptions(s) {
		key, value, hasValue := strings.Cut(o, "=")
		switch {
		case o == "" || ignoredOptions[o] || hasIgnoredPrefix(o):
		case o == "ro":
			r.sets = append(r.sets, "fuse.read_only=true")
			addFlag(flags, o)
		case flagOptions[o]:
			addFlag(flags, o)
		case o == "exec":
			*flags = slices.DeleteFunc(*flags, func(f string) bool { return f == "noexec" })
		case o == "suid" || o == "dev":
			return fmt.Errorf("-o %s: gdsfs mounts are always nosuid,nodev", o)
		case o == "allow_other":
			r.sets = append(r.sets, "fuse.allow_other=true")
		case o == "debug":
			r.sets = append(r.sets, "fuse.debug=true")
		case key == "config" && hasValue:
			r.config = value
		case key == "remount":
			return errors.New("-o remount: gdsfs cannot change a live mount; unmount and mount again")
		case hasValue && strings.Contains(key, "."):
			r.sets = append(r.sets, o)
		case sloppy:
		default:
			return fmt.Errorf("-o %s: unknown option; gdsfs options are config keys as key.sub=value "+
				"(staging.capacity=8GiB, log.file=/var/log/gdsfs.log), config=FILE, ro, noexec, nosuid, nodev, allow_other, debug, "+
				"and mount's own (defaults, noauto, _netdev, nofail, user, x-*)", o)
		}
	}
	return nil
}

func addFlag(flags *[]string, f string) {
	if !slices.Contains(*flags, f) {
		*flags = append(*flags, f)
	}
}

func hasIgnoredPrefix(o string) bool {
	for _, p := range ignoredPrefixes {
		if strings.HasPrefix(o, p) {
			return true
		}
	}
	return false
}

// splitOptions splits a comma-separated option string, keeping commas
// inside brackets: staging.gpus=[0,1] stays one option.
func splitOptions(s string) []string {
	var out []string
	depth, start := 0, 0
	for i, c := range s {
		switch c {
		case '[':
			depth++
		case ']':
			depth--
		case ',':
			if depth == 0 {
				out = append(out, strings.TrimSpace(s[start:i]))
				start = i + 1
			}
		}
	}
	return append(out, strings.TrimSpace(s[start:]))
}

// runHelper mounts as the helper: detached, returning once served.
func runHelper(args []string) error {
	h, err := parseHelper(args[1:])
	if err != nil {
		return err
	}
	if h.verbose || h.fake {
		fmt.Fprintf(os.Stderr, "gdsfs mount --daemon%s%s %s %s\n", h.req.configFlag(), h.req.setFlags(), h.req.source, h.req.mountpoint)
	}
	if h.fake {
		if _, err := config.Load(h.req.config, h.req.sets); err != nil {
			return usageError{err}
		}
		return nil
	}
	return h.req.run()
}

func (r mountRequest) configFlag() string {
	if r.config == "" {
		return ""
	}
	return " --config " + r.config
}

func (r mountRequest) setFlags() string {
	var b strings.Builder
	for _, s := range r.sets {
		b.WriteString(" --set " + s)
	}
	return b.String()
}
