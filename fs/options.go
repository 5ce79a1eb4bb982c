package fs

import (
	"fmt"
	"time"

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
	if o.EntryTimeout < 0 {
		return fmt.Errorf("fuse.entry_timeout: %s is negative", o.EntryTimeout)
	}
	return nil
}
