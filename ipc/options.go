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
	// Per-uid bounds: connections open (auto: a quarter of
	// MaxConnections; never more than half of it, so no uid can hold
	// every connection: ConnectionsPerUID), leases not released, and
	// bytes handed out over open connections (a size or a share of the
	// capacity). An acquire past MaxHeldPerUID waits for the uid's held
	// bytes to be dropped or their connections to close (heldwait.go), up
	// to AcquireTimeout.
	MaxConnectionsPerUID units.AutoCount `yaml:"max_connections_per_uid"`
	MaxLeasesPerUID      int             `yaml:"max_leases_per_uid"`
	MaxHeldPerUID        units.Share     `yaml:"max_held_per_uid"`
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
	if o.MaxConnections < 2 {
		return fmt.Errorf("ipc.max_connections: %d is below 2 (one uid may hold at most half of them)", o.MaxConnections)
	}
	if n := int(o.MaxConnectionsPerUID); n < 0 || n > o.MaxConnections/2 {
		return fmt.Errorf("ipc.max_connections_per_uid: %d is more than half of ipc.max_connections (%d): one uid could lock every other user out; use auto (a quarter) or at most %d",
			n, o.MaxConnections, o.MaxConnections/2)
	}
	if o.MaxLeasesPerUID < 1 {
		return fmt.Errorf("ipc.max_leases_per_uid: %d is below 1", o.MaxLeasesPerUID)
	}
	if o.MaxHeldPerUID.Percent == 0 && o.MaxHeldPerUID.Bytes <= 0 {
		return fmt.Errorf("ipc.max_held_per_uid: must be a positive size or percentage of the capacity")
	}
	if o.CacheHeadroom.Percent == 0 && o.CacheHeadroom.Bytes < 0 {
		return fmt.Errorf("ipc.cache_headroom: negative")
	}
	return nil
}

// ConnectionsPerUID is the per-uid connection bound: ipc.max_connections_per_uid,
// or for auto a quarter of ipc.max_connections (at least 1). Validate
// keeps it at most half of ipc.max_connections.
func (o *Options) ConnectionsPerUID() int {
	if o.MaxConnectionsPerUID.Auto() {
		return max(1, o.MaxConnections/4)
	}
	return int(o.MaxConnectionsPerUID)
}
