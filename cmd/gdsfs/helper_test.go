package main

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestHelperArgs(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want bool
	}{
		{[]string{"/sbin/mount.fuse.gdsfs", "/src", "/mnt", "-o", "rw"}, true},
		{[]string{"/usr/sbin/mount.gdsfs", "src", "mnt"}, true},
		{[]string{"gdsfs", "/src", "/mnt", "-o", "rw"}, true}, // from mount.fuse
		{[]string{"gdsfs", "mount", "/src", "/mnt"}, false},
		{[]string{"gdsfs", "--version"}, false},
		{[]string{"gdsfs", "stats", "/mnt"}, false},
	} {
		if got := helperArgs(tc.args); got != tc.want {
			t.Errorf("helperArgs(%q) = %v, want %v", tc.args, got, tc.want)
		}
	}
}

func TestParseHelper(t *testing.T) {
	for _, tc := range []struct {
		name   string
		args   []string
		sets   []string
		config string
		source string
		fake   bool
		err    string
	}{
		{name: "fstab defaults", args: []string{"/src", "/mnt", "-o", "rw,defaults,noauto,_netdev,nofail,user,x-systemd.automount,relatime,nosuid,nodev"},
			sets: []string{"fuse.mount_flags=[nosuid,nodev]"}, source: "/src"},
		{name: "ro and allow_other", args: []string{"/src", "/mnt", "-o", "ro,allow_other"},
			sets: []string{"fuse.read_only=true", "fuse.allow_other=true", "fuse.mount_flags=[ro]"}, source: "/src"},
		{name: "kernel flags", args: []string{"/src", "/mnt", "-o", "noexec,ro", "-o", "nosuid,noexec,exec"},
			sets: []string{"fuse.read_only=true", "fuse.mount_flags=[ro,nosuid]"}, source: "/src"},
		{name: "noexec", args: []string{"/src", "/mnt", "-o", "exec,noexec"}, sets: []string{"fuse.mount_flags=[noexec]"}, source: "/src"},
		{name: "suid refused", args: []string{"/src", "/mnt", "-o", "suid"}, err: "always nosuid,nodev"},
		{name: "config keys", args: []string{"/src", "/mnt", "-o", "staging.capacity=8GiB,staging.gpus=[0,1],log.level=debug", "-o", "config=/etc/gdsfs/a.yaml"},
			sets: []string{"staging.capacity=8GiB", "staging.gpus=[0,1]", "log.level=debug"}, config: "/etc/gdsfs/a.yaml", source: "/src"},
		{name: "joined -o and flags", args: []string{"-n", "-ofuse.read_only=false", "/src", "/mnt", "-t", "fuse.gdsfs", "-fv"},
			sets: []string{"fuse.read_only=false"}, source: "/src", fake: true},
		{name: "old fuse syntax", args: []string{"gdsfs#/src", "/mnt"}, source: "/src"},
		{name: "unknown option", args: []string{"/src", "/mnt", "-o", "bogus"}, err: "-o bogus: unknown option"},
		{name: "sloppy", args: []string{"-s", "/src", "/mnt", "-o", "bogus"}, source: "/src"},
		{name: "remount", args: []string{"/src", "/mnt", "-o", "remount,ro"}, err: "cannot change a live mount"},
		{name: "missing mountpoint", args: []string{"/src", "-o", "ro"}, err: "want SOURCE MOUNTPOINT"},
		{name: "bad flag", args: []string{"-x", "/src", "/mnt"}, err: "-x: unknown flag"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, err := parseHelper(tc.args)
			if tc.err != "" {
				var ue usageError
				if err == nil || !strings.Contains(err.Error(), tc.err) || !errors.As(err, &ue) {
					t.Fatalf("err = %v, want a usage error with %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(h.req.Sets, tc.sets) || h.req.Config != tc.config || h.req.Source != tc.source ||
				h.req.Mountpoint != "/mnt" || !h.req.Detach || h.fake != tc.fake {
				t.Fatalf("got %+v (fake %v), want sets %q config %q source %q", h.req, h.fake, tc.sets, tc.config, tc.source)
			}
		})
	}
}
