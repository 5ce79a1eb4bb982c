package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/gdsfs/gdsfs/daemon"
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
	req     daemon.Request
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
				return h, usageError{Err: fmt.Errorf("%s: wants a value", a)}
			}
			i++
			switch a {
			case "-o":
				opts = append(opts, args[i])
			case "-N":
				return h, usageError{Err: errors.New("-N: mounting into another namespace is not supported; run gdsfs in it")}
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
					return h, usageError{Err: fmt.Errorf("-%c: unknown flag (mount helper flags: -f -n -s -v -o OPTIONS)", f)}
				}
			}
		default:
			pos = append(pos, a)
		}
	}
	if len(pos) != 2 {
		return h, usageError{Err: fmt.Errorf("want SOURCE MOUNTPOINT [-o OPTIONS], got %d arguments %q", len(pos), pos)}
	}
	h.req = daemon.Request{Source: strings.TrimPrefix(pos[0], "gdsfs#"), Mountpoint: pos[1], Detach: true}
	var flags []string
	for _, o := range opts {
		if err := addOptions(&h.req, o, sloppy, &flags); err != nil {
			return h, usageError{Err: err}
		}
	}
	if len(flags) > 0 {
		h.req.Sets = append(h.req.Sets, "fuse.mount_flags=["+strings.Join(flags, ",")+"]")
	}
	return h, nil
}

// addOptions maps one -o string onto the request; kernel mount flags are
// added to flags.
func addOptions(r *daemon.Request, s string, sloppy bool, flags *[]string) error {
	for _, o := range splitOptions(s) {
		key, value, hasValue := strings.Cut(o, "=")
		switch {
		case o == "" || ignoredOptions[o] || hasIgnoredPrefix(o):
		case o == "ro":
			r.Sets = append(r.Sets, "fuse.read_only=true")
			addFlag(flags, o)
		case flagOptions[o]:
			addFlag(flags, o)
		case o == "exec":
			*flags = slices.DeleteFunc(*flags, func(f string) bool { return f == "noexec" })
		case o == "suid" || o == "dev":
			return fmt.Errorf("-o %s: gdsfs mounts are always nosuid,nodev", o)
		case o == "allow_other":
			r.Sets = append(r.Sets, "fuse.allow_other=true")
		case o == "debug":
			r.Sets = append(r.Sets, "fuse.debug=true")
		case key == "config" && hasValue:
			r.Config = value
		case key == "remount":
			return errors.New("-o remount: gdsfs cannot change a live mount; unmount and mount again")
		case hasValue && strings.Contains(key, "."):
			r.Sets = append(r.Sets, o)
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
		fmt.Fprintf(os.Stderr, "gdsfs mount --daemon%s%s %s %s\n", configFlag(h.req), setFlags(h.req), h.req.Source, h.req.Mountpoint)
	}
	if h.fake {
		return h.req.Check()
	}
	return h.req.Run()
}

func configFlag(r daemon.Request) string {
	if r.Config == "" {
		return ""
	}
	return " --config " + r.Config
}

func setFlags(r daemon.Request) string {
	var b strings.Builder
	for _, s := range r.Sets {
		b.WriteString(" --set " + s)
	}
	return b.String()
}
