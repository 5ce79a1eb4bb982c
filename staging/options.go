package staging

import (
	"fmt"
	"runtime"
	"time"

	"github.com/gdsfs/gdsfs/internal/units"
	"github.com/gdsfs/gdsfs/staging/loader"
	"github.com/gdsfs/gdsfs/staging/triggers/readahead"
)

// Device choices (staging.device).
const (
	DeviceAuto = "auto"
	DeviceCUDA = "cuda"
	DeviceHost = "host"
)

// Placement policies (staging.placement): where a lease that names a
// device is served from.
const (
	// PlacementReplica: on the device it names; a file staged elsewhere
	// is copied there (a replica per requesting device).
	PlacementReplica = "replica"
	// PlacementNode: one copy per node; a lease gets the copy wherever it
	// is, and a file not staged yet is staged on the device named.
	PlacementNode = "node"
)

// Peer copy choices (staging.peer_copy).
const (
	// PeerAuto copies replicas device to device where the pair has peer
	// access, and splits a file wanted on several devices between their
	// host links (split ingest).
	PeerAuto = "auto"
	// PeerOff reads every replica from SOURCE.
	PeerOff = "off"
)

// Prefetch triggers (staging.prefetch).
const (
	PrefetchOpen   = "open"
	PrefetchManual = "manual"
)

// Compat modes (io.compat_mode), KvikIO's names.
const (
	CompatAuto = loader.CompatAuto
	CompatOn   = loader.CompatOn
	CompatOff  = loader.CompatOff
)

// O_DIRECT choices (io.direct_io).
const (
	DirectAuto = loader.DirectAuto // O_DIRECT when most of the file is not in the page cache
	DirectOn   = loader.DirectOn
	DirectOff  = loader.DirectOff // the default: buffered reads, as a plain reader's
)

// Options is the staging section of config.yaml; errors name its keys.
type Options struct {
	Device string `yaml:"device"`
	GPUs   []int  `yaml:"gpus"`
	// HostDevices is how many host devices (host0 .. hostN-1, each with
	// the capacity) the host backend offers; 0 or 1: one, "host".
	HostDevices int `yaml:"host_devices"`
	// Placement is PlacementReplica ("" too) or PlacementNode.
	Placement string `yaml:"placement"`
	// PeerCopy is PeerAuto ("" too) or PeerOff.
	PeerCopy        string      `yaml:"peer_copy"`
	Capacity        units.Share `yaml:"capacity"`
	ChunkSize       units.Size  `yaml:"chunk_size"`
	MinFileSize     units.Size  `yaml:"min_file_size"`
	Include         []string    `yaml:"include"`
	Exclude         []string    `yaml:"exclude"`
	Prefetch        string      `yaml:"prefetch"`
	PrefetchQueue   int         `yaml:"prefetch_queue"`
	PrefetchWorkers int         `yaml:"prefetch_workers"`
	// Watch is how changes to SOURCE are detected: WatchAuto (also when
	// empty) or WatchTimestamps.
	Watch string `yaml:"watch"`
	// RacyWindow is the racy-timestamp rule's window (racy.go): a file
	// whose mtime or ctime is younger than this is read only once it is
	// not, where no change events exist.
	RacyWindow time.Duration `yaml:"racy_window"`
	// DeferWhileRead: with Prefetch open, a file opened for reading
	// through the mount is staged after its last close
	// (staging/triggers.AfterRead).
	DeferWhileRead bool `yaml:"defer_while_read"`
	// DeferLimit: a file held open longer is staged anyway; 0: no limit.
	DeferLimit time.Duration `yaml:"defer_limit"`
	// WarmChunks: chunks of ChunkSize a GPU keeps allocated ahead of need
	// (gpu.Options.WarmChunks).
	WarmChunks int `yaml:"warm_chunks"`
	// Read-ahead across files and access traces (readahead.go): the files
	// planned ahead of readers at once (0: off; a directory whose readers
	// spread over more gets as many), the bytes planned at once, the
	// accesses recorded in .gdsfs/trace (0: none), and a trace staged in
	// its order at start ("": none).
	ReadAheadFiles int        `yaml:"readahead_files"`
	ReadAheadBytes units.Size `yaml:"readahead_bytes"`
	TraceEntries   int        `yaml:"trace_entries"`
	Replay         string     `yaml:"replay"`
}

// ReadAhead is the read-ahead keys as readahead.Options.
func (o *Options) ReadAhead() readahead.Options {
	return readahead.Options{Files: o.ReadAheadFiles, Bytes: o.ReadAheadBytes,
		TraceEntries: o.TraceEntries, Replay: o.Replay}
}

// IOOptions is the io section of config.yaml: how a file is loaded.
type IOOptions struct {
	CompatMode   string          `yaml:"compat_mode"`
	GDSThreshold units.Size      `yaml:"gds_threshold"`
	TaskSize     units.Size      `yaml:"task_size"`
	BounceSize   units.AutoSize  `yaml:"bounce_size"` // 0: auto (loader.AutoBounce)
	NumThreads   units.AutoCount `yaml:"num_threads"` // 0: auto (loader.AutoThreads)
	DirectIO     string          `yaml:"direct_io"`
}

// Validate checks the staging options, naming the key at fault.
func (o *Options) Validate() error {
	switch o.Device {
	case DeviceAuto, DeviceCUDA, DeviceHost:
	default:
		return fmt.Errorf("staging.device: %q is not one of auto, cuda, host", o.Device)
	}
	if len(o.GPUs) == 0 {
		return fmt.Errorf("staging.gpus: empty; list at least one device ordinal")
	}
	seen := map[int]bool{}
	for _, g := range o.GPUs {
		if g < 0 || seen[g] {
			return fmt.Errorf("staging.gpus: ordinal %d is negative or repeated", g)
		}
		seen[g] = true
	}
	if o.HostDevices < 0 || o.HostDevices > 64 {
		return fmt.Errorf("staging.host_devices: %d is outside 0..64", o.HostDevices)
	}
	switch o.Placement {
	case "", PlacementReplica, PlacementNode:
	default:
		return fmt.Errorf("staging.placement: %q is not one of replica, node", o.Placement)
	}
	switch o.PeerCopy {
	case "", PeerAuto, PeerOff:
	default:
		return fmt.Errorf("staging.peer_copy: %q is not one of auto, off", o.PeerCopy)
	}
	if o.Capacity.Percent == 0 && o.Capacity.Bytes <= 0 {
		return fmt.Errorf("staging.capacity: must be a positive size or percentage")
	}
	if o.ChunkSize < 4096 {
		return fmt.Errorf("staging.chunk_size: %s is below 4KiB", o.ChunkSize)
	}
	if _, err := newFilter(o); err != nil {
		return err
	}
	switch o.Prefetch {
	case PrefetchOpen, PrefetchManual:
	default:
		return fmt.Errorf("staging.prefetch: %q is not one of open, manual", o.Prefetch)
	}
	if o.PrefetchQueue < 1 {
		return fmt.Errorf("staging.prefetch_queue: %d is below 1", o.PrefetchQueue)
	}
	if o.PrefetchWorkers < 1 || o.PrefetchWorkers > 256 {
		return fmt.Errorf("staging.prefetch_workers: %d is outside 1..256", o.PrefetchWorkers)
	}
	switch o.Watch {
	case "", WatchAuto, WatchTimestamps:
	default:
		return fmt.Errorf("staging.watch: %q is not one of auto, timestamps", o.Watch)
	}
	if o.WarmChunks < 0 || o.WarmChunks > 64 {
		return fmt.Errorf("staging.warm_chunks: %d is outside 0..64", o.WarmChunks)
	}
	if o.DeferLimit < 0 {
		return fmt.Errorf("staging.defer_limit: %s is negative", o.DeferLimit)
	}
	if o.RacyWindow < 0 || o.RacyWindow > time.Minute {
		return fmt.Errorf("staging.racy_window: %s is outside 0..1m", o.RacyWindow)
	}
	return o.ReadAhead().Validate()
}

// Validate checks the io options, naming the key at fault.
func (o *IOOptions) Validate() error {
	switch o.CompatMode {
	case CompatAuto, CompatOn, CompatOff:
	default:
		return fmt.Errorf("io.compat_mode: %q is not one of auto, on, off", o.CompatMode)
	}
	if o.TaskSize < 4096 || o.TaskSize > 1<<30 || o.TaskSize%4096 != 0 {
		return fmt.Errorf("io.task_size: %s must be a multiple of 4KiB between 4KiB and 1GiB", o.TaskSize)
	}
	if !o.BounceSize.Auto() && (o.BounceSize < 4096 || o.BounceSize > 1<<30 || o.BounceSize%4096 != 0) {
		return fmt.Errorf("io.bounce_size: %s must be auto or a multiple of 4KiB between 4KiB and 1GiB", o.BounceSize)
	}
	switch o.DirectIO {
	case DirectAuto, DirectOn, DirectOff:
	default:
		return fmt.Errorf("io.direct_io: %q is not one of auto, on, off", o.DirectIO)
	}
	if o.NumThreads < 0 || o.NumThreads > 256 {
		return fmt.Errorf("io.num_threads: %d is outside 1..256 (or auto)", o.NumThreads)
	}
	if o.GDSThreshold < 0 {
		return fmt.Errorf("io.gds_threshold: negative")
	}
	return nil
}

// resolved is o with auto values replaced by the loader's rule.
func (o IOOptions) resolved() IOOptions {
	if o.NumThreads.Auto() {
		o.NumThreads = units.AutoCount(loader.AutoThreads(runtime.NumCPU()))
	}
	if o.BounceSize.Auto() {
		o.BounceSize = units.AutoSize(loader.AutoBounce(int(o.NumThreads)))
	}
	return o
}

// loaderOptions is o, resolved, as the loader takes it.
func (o IOOptions) loaderOptions() loader.Options {
	return loader.Options{
		NumThreads: int(o.NumThreads), BounceSize: int(units.Size(o.BounceSize)), TaskSize: int64(o.TaskSize),
		CompatMode: o.CompatMode, GDSThreshold: int64(o.GDSThreshold), DirectIO: o.DirectIO,
	}
}
