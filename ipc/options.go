package ipc

import (
	"fmt"
	"time"

	"github.com/gdsfs/gdsfs/internal/units"
	"github.com/gdsfs/gdsfs/proto"
)

// Sharing modes (ipc.sharing).
const (
	SharingShared  = proto.SharingShared
	SharingPrivate = proto.SharingPrivate
)

// Options is the ipc section of config.yaml; errors name its keys.
type Options struct {
	Socket         string        `yaml:"socket"`
	Sharing        string        `yaml:"sharing"`
	AcquireTimeout time.Duration `yaml:"acquire_timeout"`
	MaxRequest     units.Size    `yaml:"max_request"`
	MaxConnections int           `yaml:"max_connections"`
	// Per-uid bounds: connections open, leases not released, and bytes
	// handed out over open connections (a size or a share of the
	// capacity). An acquire past MaxHeldPerUID waits for the uid's
	// connections to close (heldwait.go), up to AcquireTimeout.
	MaxConnectionsPerUID int         `yaml:"max_connections_per_uid"`
	MaxLeasesPerUID      int         `yaml:"max_leases_per_uid"`
	MaxHeldPerUID        units.Share `yaml:"max_held_per_uid"`
	// IdleTimeout closes a connection that holds nothing and sends
	// nothing; RequestTimeout closes one that started a request line and
	// did not finish it.
	IdleTimeout    time.Duration `yaml:"idle_timeout"`
	RequestTimeout time.Duration `yaml:"request_timeout"`
	// CacheHeadroom: acquire answers let clients keep a released file
	// mapped (the repeat-lease fast path) only while at least this much of
	// the capacity is free.
	CacheHeadroom units.Share `yaml:"cache_headroom"`
}

// Validate checks the options, naming the key at fault.
func (o *Options) Validate() error {
	switch o.Sharing {
	case SharingShared, SharingPrivate:
	default:
		return fmt.Errorf("ipc.sharing: %q is not one of shared, private", o.Sharing)
	}
	for _, d := range []struct {
		key string
		v   time.Duration
	}{{"acquire_timeout", o.AcquireTimeout}, {"idle_timeout", o.IdleTimeout}, {"request_timeout", o.RequestTimeout}} {
		if d.v <= 0 {
			return fmt.Errorf("ipc.%s: %s must be positive", d.key, d.v)
		}
	}
	if o.MaxRequest < 256 || o.MaxRequest > 16<<20 {
		return fmt.Errorf("ipc.max_request: %s is outside 256..16MiB", o.MaxRequest)
	}
	for _, n := range []struct {
		key string
		v   int
	}{{"max_connections", o.MaxConnections}, {"max_connections_per_uid", o.MaxConnectionsPerUID}, {"max_leases_per_uid", o.MaxLeasesPerUID}} {
		if n.v < 1 {
			return fmt.Errorf("ipc.%s: %d is below 1", n.key, n.v)
		}
	}
	if o.MaxHeldPerUID.Percent == 0 && o.MaxHeldPerUID.Bytes <= 0 {
		return fmt.Errorf("ipc.max_held_per_uid: must be a positive size or percentage of the capacity")
	}
	if o.CacheHeadroom.Percent == 0 && o.CacheHeadroom.Bytes < 0 {
		return fmt.Errorf("ipc.cache_headroom: negative")
	}
	return nil
}
