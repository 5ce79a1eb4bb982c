// Package chunkmap maps the chunks of a staged file, as the daemon exports
// them (one descriptor per chunk, in order), into one contiguous range of
// this process: host memory for memfd chunks, a CUDA device range for GPU
// chunks (VMM import through libcuda.so.1, loaded at run time without
// cgo). It is the one consumer-side mapping in Go: the client maps leases
// with it and the gpu backends' tests check their exports with it.
//
// Shared mappings are read-only; writable ones are private to this
// process (copy-on-write on the host). The package builds with
// CGO_ENABLED=0 and imports only proto, x/sys and purego.
package chunkmap

import (
	"fmt"
	"io"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/proto"
)

// Mapping is a consumer's view of a file's chunks: host or CUDA.
type Mapping interface {
	// Ptr is the address of the first byte: a host address for host
	// chunks, a device address for CUDA chunks.
	Ptr() uint64
	// ReadAt copies file bytes to p (device to host for CUDA).
	ReadAt(p []byte, off int64) (int, error)
	// ReadOnly says whether the mapping refuses writes.
	ReadOnly() bool
	// Close unmaps; closing twice does nothing.
	Close() error
}

// Map maps files (the chunks of one file, in order, lens[i] bytes each)
// on device: a host mapping when proto.IsHost(device), else the CUDA
// device named "GPU-<uuid>". size is the file's size (the chunks may hold
// more). Map does not close the files.
func Map(device string, files []*os.File, lens []int64, size int64, writable bool) (Mapping, error) {
	if proto.IsHost(device) {
		return Host(files, lens, size, writable)
	}
	return CUDA(device, files, lens, size, writable)
}

// check validates the chunk list and returns the bytes the chunks hold.
func check(files []*os.File, lens []int64, size int64) (int64, error) {
	if len(files) == 0 || len(files) != len(lens) {
		return 0, fmt.Errorf("%d descriptors for %d chunks", len(files), len(lens))
	}
	var total int64
	for i, n := range lens {
		if n <= 0 || files[i] == nil {
			return 0, fmt.Errorf("chunk %d has length %d or no descriptor", i, n)
		}
		total += n
	}
	if size < 0 || size > total {
		return 0, fmt.Errorf("size %d outside chunks of %d bytes", size, total)
	}
	return total, nil
}

// HostMapping is memfd chunks mapped back to back. Read-only ones are
// PROT_READ over MAP_SHARED (a sealed memfd cannot be mapped writable by
// any process); writable ones are MAP_PRIVATE, copy-on-write in this
// process only.
type HostMapping struct {
	mem      []byte // the whole reserved range
	size     int64
	writable bool
}

var _ Mapping = (*HostMapping)(nil)

// Host maps memfd chunks contiguously; see Map.
func Host(files []*os.File, lens []int64, size int64, writable bool) (*HostMapping, error) {
	total, err := check(files, lens, size)
	if err != nil {
		return nil, err
	}
	mem, err := unix.Mmap(-1, 0, int(total), unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		return nil, fmt.Errorf("reserve %d bytes: %w", total, err)
	}
	prot, flags := unix.PROT_READ, unix.MAP_SHARED
	if writable {
		prot, flags = unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE
	}
	var off int64
	for i, f := range files {
		var st unix.Stat_t
		if err := unix.Fstat(int(f.Fd()), &st); err != nil || st.Size < lens[i] {
			unix.Munmap(mem)
			return nil, fmt.Errorf("chunk %d: descriptor holds %d bytes, want %d (%v)", i, st.Size, lens[i], err)
		}
		addr := uintptr(unsafe.Pointer(&mem[off]))
		_, _, errno := unix.Syscall6(unix.SYS_MMAP, addr, uintptr(lens[i]), uintptr(prot), uintptr(flags|unix.MAP_FIXED), f.Fd(), 0)
		if errno != 0 {
			unix.Munmap(mem)
			return nil, fmt.Errorf("chunk %d: %w", i, errno)
		}
		off += lens[i]
	}
	return &HostMapping{mem: mem, size: size, writable: writable}, nil
}

// Bytes returns the file's bytes; valid until Close.
func (m *HostMapping) Bytes() []byte { return m.mem[:m.size] }

// Size is the file size.
func (m *HostMapping) Size() int64 { return m.size }

// Ptr is the address of the mapping in this process.
func (m *HostMapping) Ptr() uint64 { return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(m.mem)))) }

// ReadOnly says whether the mapping refuses writes.
func (m *HostMapping) ReadOnly() bool { return !m.writable }

// ReadAt copies file bytes to p.
func (m *HostMapping) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 || off > m.size {
		return 0, fmt.Errorf("read at %d: outside %d bytes", off, m.size)
	}
	n := copy(p, m.mem[off:m.size])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// Close unmaps; closing twice does nothing.
func (m *HostMapping) Close() error {
	if m.mem == nil {
		return nil
	}
	err := unix.Munmap(m.mem)
	m.mem = nil
	return err
}
