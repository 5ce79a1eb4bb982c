package ipc

import (
	"fmt"
	"time"

	"github.com/gdsfs/gdsfs/internal/units"
)

// Sharing modes (ipc.sharing).
const (
	SharingShared  = "shared"
	SharingPrivate = "private"
)

// Options is the ipc section of config.yaml; errors name its keys.
type Options struct {
	Socket         string        `yaml:"socket"`
	Sharing        string        `yaml:"sharing"`
	AcquireTimeout time.Duration `yaml:"acquire_timeout"`
	MaxRequest     units.Size    `yaml:"max_request"`
	MaxConnections int           `yaml:"max_connections"`
}

// Validate checks the options, naming the key at fault.
func (o *Options) Validate() error {
	switch o.Sharing {
	case SharingShared, SharingPrivate:
	default:
		return fmt.Errorf("ipc.sharing: %q is not one of shared, private", o.Sharing)
	}
	if o.AcquireTimeout <= 0 {
		return fmt.Errorf("ipc.acquire_timeout: %s must be positive", o.AcquireTimeout)
	}
	if o.MaxRequest < 256 || o.MaxRequest > 16<<20 {
		return fmt.Errorf("ipc.max_request: %s is outside 256..16MiB", o.MaxRequest)
	}
	if o.MaxConnections < 1 {
		return fmt.Errorf("ipc.max_connections: %d is below 1", o.MaxConnections)
	}
	return nil
}
