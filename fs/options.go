package fs

import (
	"fmt"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/internal/units"
)

// Passthrough modes (fuse.passthrough).
const (
	PassthroughAuto = "auto"
	PassthroughOn   = "on"
	PassthroughOff  = "off"
)

// Options is the fuse section of config.yaml; errors name its keys.
type Options struct {
	ReadOnly     bool          `yaml:"read_only"`
	Passthrough  string        `yaml:"passthrough"`
	MaxRead      units.Size    `yaml:"max_read"`
	ReadAhead    units.Size    `yaml:"read_ahead"`
	AllowOther   bool          `yaml:"allow_other"`
	AttrTimeout  time.Duration `yaml:"attr_timeout"`
	EntryTimeout time.Duration `yaml:"entry_timeout"`
	Debug        bool          `yaml:"debug"`
	// MountFlags are kernel mount flags (mountFlagBits); nosuid and nodev
	// are always set.
	MountFlags []string `yaml:"mount_flags"`
	// MaxOpenPerUID bounds the files and directories one uid holds open
	// through the mount, each a descriptor in the daemon (fdbudget.go);
	// auto: a quarter of the descriptors staging leaves out of its
	// budget (OpenPerUID).
	MaxOpenPerUID units.AutoCount `yaml:"max_open_per_uid"`
}

// mountFlagBits are the flags fuse.mount_flags may name.
var mountFlagBits = map[string]uintptr{
	"ro": unix.MS_RDONLY, "noexec": unix.MS_NOEXEC, "nosuid": unix.MS_NOSUID, "nodev": unix.MS_NODEV,
}

// maxKernelRead is the largest FUSE request Linux accepts (256 pages).
const maxKernelRead = 1 << 20

// Validate checks the options, naming the config key at fault.
func (o *Options) Validate() error {
	switch o.Passthrough {
	case PassthroughAuto, PassthroughOn, PassthroughOff:
	default:
		return fmt.Errorf("fuse.passthrough: %q is not one of auto, on, off", o.Passthrough)
	}
	if o.MaxRead < 4096 || o.MaxRead > maxKernelRead {
		return fmt.Errorf("fuse.max_read: %s is outside 4KiB..1MiB", o.MaxRead)
	}
	if o.ReadAhead < 0 || o.ReadAhead > 1<<30 {
		return fmt.Errorf("fuse.read_ahead: %s is outside 0..1GiB", o.ReadAhead)
	}
	if o.AttrTimeout < 0 {
		return fmt.Errorf("fuse.attr_timeout: %s is negative", o.AttrTimeout)
	}
	for _, f := range o.MountFlags {
		if _, ok := mountFlagBits[f]; !ok {
			return fmt.Errorf("fuse.mount_flags: %q is not one of ro, noexec, nosuid, nodev", f)
		}
		if f == "ro" && !o.ReadOnly {
			return fmt.Errorf("fuse.mount_flags: ro with fuse.read_only false: a read-only mount cannot pass writes")
		}
	}
	if o.EntryTimeout < 0 {
		return fmt.Errorf("fuse.entry_timeout: %s is negative", o.EntryTimeout)
	}
	return nil
}
