package client

import (
	"os"
	"strings"
	"sync"
	"time"

	"github.com/gdsfs/gdsfs/client/chunkmap"
	"github.com/gdsfs/gdsfs/proto"
)

// Placement: a lease names the device its consumer runs on, and a daemon
// that stages onto several GPUs (staging.placement replica) leases the
// replica there, so the pointer is local to the consumer's GPU.

// LeaseOption adjusts a lease request (Open, OpenMany, Conn.Acquire).
type LeaseOption func(*leaseOpts)

type leaseOpts struct {
	device   string
	set      bool
	roomWait time.Duration
}

// OnDevice asks for the lease on device: "GPU-<uuid>", "host", "hostN",
// or an ordinal of the daemon's staging.gpus; "" asks for none (the daemon
// places the file). Without it a lease names DefaultDevice().
func OnDevice(device string) LeaseOption {
	return func(o *leaseOpts) { o.device, o.set = device, true }
}

// RoomWait bounds how long the daemon may wait for room (its capacity,
// or the uid's ipc.max_held_per_uid, held by other leases) before it
// answers ENOSPC or EDQUOT: sent as room_wait_ms, whole milliseconds (at
// least 1). Staging the file stays bounded by ipc.acquire_timeout alone.
// Without it (or with d <= 0) ipc.acquire_timeout bounds the wait too.
func RoomWait(d time.Duration) LeaseOption {
	return func(o *leaseOpts) { o.roomWait = d }
}

// roomWaitMS is the room_wait_ms a request sends under opts (0: none).
func roomWaitMS(opts []LeaseOption) int64 {
	var o leaseOpts
	for _, fn := range opts {
		fn(&o)
	}
	if o.roomWait <= 0 {
		return 0
	}
	return min(max(o.roomWait.Milliseconds(), 1), proto.MaxWaitMS)
}

// device is the device a request names under opts.
func deviceFor(opts []LeaseOption) string {
	var o leaseOpts
	for _, fn := range opts {
		fn(&o)
	}
	if o.set {
		return o.device
	}
	return DefaultDevice()
}

var defaultDevice struct {
	mu    sync.Mutex
	found bool   // guarded by mu
	name  string // guarded by mu
}

// DefaultDevice is the device leases name when no OnDevice is given, found
// once per process: GDSFS_DEVICE when set ("none" or empty: no device);
// else the first entry of CUDA_VISIBLE_DEVICES when it is a UUID
// ("GPU-..."); else the UUID of this process's CUDA device 0 when
// libcuda.so.1 loads and shows a device (CUDA_VISIBLE_DEVICES applies);
// else "" (none: the daemon places the file, as with a host-only
// consumer).
func DefaultDevice() string {
	defaultDevice.mu.Lock()
	defer defaultDevice.mu.Unlock()
	if !defaultDevice.found {
		defaultDevice.name, defaultDevice.found = findDefaultDevice(), true
	}
	return defaultDevice.name
}

// forgetDefaultDevice makes the next DefaultDevice look again (DropCache).
func forgetDefaultDevice() {
	defaultDevice.mu.Lock()
	defaultDevice.found = false
	defaultDevice.mu.Unlock()
}

func findDefaultDevice() string {
	if v, ok := os.LookupEnv("GDSFS_DEVICE"); ok {
		if v = strings.TrimSpace(v); v == "none" {
			return ""
		}
		return strings.TrimSpace(v)
	}
	if v, ok := os.LookupEnv("CUDA_VISIBLE_DEVICES"); ok {
		first, _, _ := strings.Cut(v, ",")
		if first = strings.TrimSpace(first); strings.HasPrefix(first, "GPU-") {
			return first
		}
		if first == "" {
			return "" // no device visible
		}
	}
	name, err := chunkmap.FirstCUDADevice()
	if err != nil {
		return ""
	}
	return name
}
