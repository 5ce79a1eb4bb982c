// Package gpu holds the contract between the staging cache and the memory it
// stages into: a Device hands out exportable Regions, Workers that copy host
// bytes into them, and (on CUDA) a cuFile driver that reads files straight
// into them.
//
// Two backends implement it: gpu/cuda (libcuda.so.1 and libcufile.so.0 by
// dlopen; the only cgo in gdsfs) and gpu/host (memfd regions, no GPU). This
// package holds only types: it must never import a backend, and nothing in it
// may need cgo.
package gpu

import (
	"errors"
	"os"
)

// Backend names, as staging.device and the load-path counters spell them.
const (
	KindCUDA = "cuda"
	KindHost = "host"
)

// Device is one place staged bytes live: a GPU, or host memory.
// All methods are safe for concurrent use.
type Device interface {
	// Kind is KindCUDA or KindHost.
	Kind() string
	// Name identifies the device to consumers: "GPU-<uuid>", "host", or
	// "hostN" for one of several host devices (staging.host_devices).
	Name() string
	// Ordinal is the CUDA device ordinal; on the host backend N for
	// "hostN" and -1 for the one "host".
	Ordinal() int
	// Granularity is the allocation granularity; every chunk of a Region is
	// a multiple of it.
	Granularity() int64
	// MemInfo reports free and total device memory in bytes.
	MemInfo() (free, total int64, err error)
	// HeldDescriptors is how many file descriptors a Region of size bytes
	// keeps open in this process until it is freed (the host backend: one
	// memfd per chunk; CUDA: none, descriptors exist only once exported).
	// Descriptors are a budget like memory: the cache counts them.
	HeldDescriptors(size int64) int
	// Alloc returns a Region of at least size bytes, made of one or more
	// chunks no larger than the device's chunk size, mapped contiguously in
	// this process.
	Alloc(size int64) (Region, error)
	// NewWorker returns a copy worker with two host bounce buffers of
	// bufSize bytes each (pinned on CUDA) and its own stream. A Worker is
	// used by one goroutine at a time.
	NewWorker(bufSize int) (Worker, error)
	// Copy copies src into dst (device to device), for private leases.
	// dst must be at least as large as src.
	Copy(dst, src Region) error
	// CuFile returns the cuFile driver, or nil and the reason it is not
	// available ("libcufile.so.0 not found", "host backend", ...).
	CuFile() (CuFile, string)
	// Close releases the device. Regions and Workers must be freed first.
	Close() error
}

// Region is one file's staged bytes.
type Region interface {
	// Size is the number of bytes asked for; the chunks may hold more.
	Size() int64
	// Chunks returns the length of each chunk, in mapping order.
	Chunks() []int64
	// Export returns one new descriptor per chunk (memfd, or a CUDA POSIX
	// shareable handle). The caller closes them.
	Export() ([]*os.File, error)
	// ReadAt copies device bytes to p (device to host), synchronously.
	ReadAt(p []byte, off int64) (int, error)
	// Seal marks the region complete: the host backend forbids further
	// writes through any mapping; CUDA makes this a no-op.
	Seal() error
	// Free releases the region. Exported descriptors stay valid on their
	// own until their holders close them.
	Free() error
}

// Worker copies host bytes into Regions through two bounce buffers, so one
// can be filled while the other is being copied.
type Worker interface {
	// Buffer returns bounce buffer i (0 or 1).
	Buffer(i int) []byte
	// CopyAsync starts copying Buffer(i)[:n] to dst at off. The buffer must
	// not be written until Wait(i) returns.
	CopyAsync(dst Region, off int64, i, n int) error
	// Wait blocks until the last copy started from Buffer(i) completed and
	// returns its error.
	Wait(i int) error
	// Close waits for pending copies and frees the buffers and stream.
	Close() error
}

// Peer is what a Device offers to copy between its Regions and those of
// another device of the same backend: replicas of one file on several
// GPUs are filled device to device (NVLink or PCIe peer-to-peer) instead
// of from host memory. Both backends implement it; the host backend's
// "peer copy" is a memcpy between regions.
type Peer interface {
	// PeerAccess says whether this device and other can copy between
	// their regions directly, enabling it the first time (once per
	// pair); when not, why. A device always has access to itself.
	PeerAccess(other Device) (ok bool, why string)
	// CopyRange copies n bytes at srcOff of src, a Region of this device
	// or of a device PeerAccess allowed, to dstOff of dst, a Region of
	// this device, and waits for the copy.
	CopyRange(dst Region, dstOff int64, src Region, srcOff, n int64) error
}

// Importer is what a Device offers to take over regions another process
// staged and exported (Region.Export): a daemon that hands its cache to
// its successor passes each region's descriptors, and the successor
// serves the same memory without copying a byte. Both backends implement
// it.
type Importer interface {
	// Import returns a Region of this device made of files, one
	// descriptor per chunk of the lengths chunks, holding size bytes,
	// complete (sealed where the backend seals). It maps them as Alloc
	// would; the files stay the caller's (the Region holds its own
	// references). The memory is shared with whoever else holds the
	// descriptors: freeing the Region releases only this process's hold.
	Import(files []*os.File, chunks []int64, size int64) (Region, error)
}

// CuFile is a device's cuFile (GPUDirect Storage) driver.
type CuFile interface {
	// Mode is "gds" when nvidia-fs moves data by DMA, "compat" when cuFile
	// runs its POSIX compatibility path.
	Mode() string
	// Register registers an open file descriptor. The error says why
	// cuFile refused it (it names the cuFile status).
	Register(fd int) (CuFileHandle, error)
}

// CuFileHandle is a registered file. ReadInto is safe for concurrent use.
type CuFileHandle interface {
	// ReadInto reads n bytes at fileOff into dst at dstOff and returns the
	// number of bytes read.
	ReadInto(dst Region, dstOff, fileOff int64, n int) (int, error)
	// Close deregisters the file (the descriptor stays open).
	Close() error
}

// ErrOutOfMemory is wrapped by Alloc when the device has no room.
var ErrOutOfMemory = errors.New("out of device memory")

// Options configure a backend. ChunkSize bounds one allocation; it is rounded
// up to the device granularity.
type Options struct {
	ChunkSize int64
	// WarmChunks is how many chunks of ChunkSize a backend that allocates
	// slowly (CUDA) keeps allocated ahead of need; 0: none.
	WarmChunks int
}

// RoundUp rounds n up to a multiple of g (g > 0).
func RoundUp(n, g int64) int64 {
	if g <= 0 {
		return n
	}
	return (n + g - 1) / g * g
}

// SplitChunks splits size bytes into chunk lengths, each a multiple of
// granularity and no larger than chunkSize rounded up to granularity. A size
// of 0 still gets one chunk of one granule so it can be exported.
func SplitChunks(size, chunkSize, granularity int64) []int64 {
	total := RoundUp(max(size, 1), granularity)
	cs := RoundUp(max(chunkSize, granularity), granularity)
	var out []int64
	for total > 0 {
		n := min(cs, total)
		out = append(out, n)
		total -= n
	}
	return out
}
