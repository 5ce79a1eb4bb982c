package fs

import (
	"strings"
	"testing"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/internal/units"
)

// TestMountFlags: fuse.mount_flags become mount(2) flags and fusermount
// words; nosuid and nodev are always set; bad flags name the key.
func TestMountFlags(t *testing.T) {
	for _, tc := range []struct {
		flags    []string
		readOnly bool
		want     uintptr
		err      string
	}{
		{nil, true, unix.MS_NOSUID | unix.MS_NODEV, ""},
		{[]string{"ro", "noexec"}, true, unix.MS_NOSUID | unix.MS_NODEV | unix.MS_RDONLY | unix.MS_NOEXEC, ""},
		{[]string{"nosuid"}, false, unix.MS_NOSUID | unix.MS_NODEV, ""},
		{[]string{"ro"}, false, 0, "fuse.mount_flags: ro with fuse.read_only false"},
		{[]string{"suid"}, true, 0, `fuse.mount_flags: "suid" is not one of`},
	} {
		o := Options{Passthrough: PassthroughAuto, MaxRead: units.Size(1 << 20), ReadOnly: tc.readOnly, MountFlags: tc.flags}
		err := o.Validate()
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: Validate() = %v, want %q", tc.flags, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%q: %v", tc.flags, err)
		}
		mo := (&Server{opts: o, log: zap.NewNop()}).mountOptions().MountOptions
		if mo.DirectMountFlags != tc.want {
			t.Errorf("%q: mount flags %#x, want %#x", tc.flags, mo.DirectMountFlags, tc.want)
		}
		for _, f := range tc.flags {
			if !strings.Contains(strings.Join(mo.Options, ","), f) {
				t.Errorf("%q: fusermount options %q lack %s", tc.flags, mo.Options, f)
			}
		}
	}
}
