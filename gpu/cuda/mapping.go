package cuda

import (
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"sync"
)

// Mapping is an importer's view of exported chunks: each chunk fd imported
// (cuMemImportFromShareableHandle) and mapped back to back in one reserved
// range, readable and writable by the device, under the primary context of
// the device that owns the memory. The daemon's own tests use it to check
// that exports import (in this process and in a child). Consumers do not:
// the Go client (client/cuda.go, no cgo) and the Python client map leases
// themselves, read-only for shared grants (proto/PROTOCOL.md, "Mapping").
type Mapping struct {
	ctx    *cuContext
	reader *hostReader
	base   uint64
	lens   []int64
	size   int64

	mu     sync.RWMutex // shared by reads, exclusive in Close
	closed bool
}

// Map imports the chunk descriptors of one exported Region and maps them
// contiguously. device is the exporting Device's Name ("GPU-<uuid>"); lens
// are the chunk lengths (Region.Chunks), one per file. Map does not close
// the files.
func Map(device string, files []*os.File, lens []int64) (*Mapping, error) {
	if len(files) == 0 || len(files) != len(lens) {
		return nil, fmt.Errorf("cuda: map: %d files for %d chunk lengths", len(files), len(lens))
	}
	for i, n := range lens {
		if n <= 0 || files[i] == nil {
			return nil, fmt.Errorf("cuda: map: chunk %d has length %d or no file", i, n)
		}
	}
	if err := loadCUDA(); err != nil {
		return nil, fmt.Errorf("cuda: %w", err)
	}
	ctx, err := mapContext(device)
	if err != nil {
		return nil, err
	}
	m := &Mapping{ctx: ctx, reader: &hostReader{ctx: ctx}, lens: append([]int64(nil), lens...)}
	for _, n := range lens {
		m.size += n
	}
	if err := m.build(files); err != nil {
		return nil, fmt.Errorf("cuda: map %d chunks on %s: %w", len(files), device, err)
	}
	return m, nil
}

// mapContexts holds the primary context of each device Map was used on,
// retained for the life of the process as a CUDA runtime keeps it:
// releasing the last reference destroys the context, and making it again
// costs about 100 ms per lease.
var mapContexts struct {
	sync.Mutex
	byName map[string]*cuContext // guarded by the mutex
}

func mapContext(device string) (*cuContext, error) {
	mapContexts.Lock()
	defer mapContexts.Unlock()
	if c := mapContexts.byName[device]; c != nil {
		return c, nil
	}
	info, err := findDevice(device)
	if err != nil {
		return nil, fmt.Errorf("cuda: map: %w", err)
	}
	c, err := retainContext(info)
	if err != nil {
		return nil, fmt.Errorf("cuda: map on %s: %w", device, err)
	}
	if mapContexts.byName == nil {
		mapContexts.byName = map[string]*cuContext{}
	}
	mapContexts.byName[device] = c
	return c, nil
}

// findDevice returns the device whose Name is name.
func findDevice(name string) (deviceInfo, error) {
	n, err := deviceCount()
	if err != nil {
		return deviceInfo{}, err
	}
	for i := 0; i < n; i++ {
		info, err := queryDevice(i)
		if err != nil {
			return deviceInfo{}, err
		}
		if formatUUID(info.uuid) == name {
			return info, nil
		}
	}
	return deviceInfo{}, fmt.Errorf("no device %q among %d devices", name, n)
}

// build imports, maps and opens each chunk; on failure it undoes all of it.
// Handles are released once mapped: the mapping keeps the memory alive.
func (m *Mapping) build(files []*os.File) error {
	handles := make([]uint64, 0, len(files))
	release := func() {
		for _, h := range handles {
			_ = m.ctx.memRelease(h)
		}
	}
	for i, f := range files {
		h, err := m.ctx.importFD(int(f.Fd()))
		if err != nil {
			release()
			return fmt.Errorf("import chunk %d: %w", i, err)
		}
		handles = append(handles, h)
	}
	runtime.KeepAlive(files)
	base, err := m.ctx.reserve(m.size)
	if err != nil {
		release()
		return fmt.Errorf("reserve %d bytes: %w", m.size, err)
	}
	m.base = base
	mapped, err := m.mapAll(handles)
	release()
	if err != nil {
		_ = m.unmap(mapped)
		return err
	}
	return nil
}

// mapAll maps and opens each chunk in order; it returns how many it mapped.
func (m *Mapping) mapAll(handles []uint64) (int, error) {
	off := m.base
	for i, h := range handles {
		if err := m.ctx.mapMem(off, m.lens[i], h); err != nil {
			return i, fmt.Errorf("map chunk %d: %w", i, err)
		}
		if err := m.ctx.setAccess(off, m.lens[i]); err != nil {
			return i + 1, fmt.Errorf("set access on chunk %d: %w", i, err)
		}
		off += uint64(m.lens[i])
	}
	return len(handles), nil
}

// unmap unmaps the first mapped chunks and frees the reserved range.
func (m *Mapping) unmap(mapped int) error {
	var errs []error
	off := m.base
	for i := 0; i < mapped; i++ {
		errs = append(errs, m.ctx.unmap(off, m.lens[i]))
		off += uint64(m.lens[i])
	}
	errs = append(errs, m.ctx.addressFree(m.base, m.size))
	return errors.Join(errs...)
}

// Ptr is the device address of the first byte.
func (m *Mapping) Ptr() uint64 { return m.base }

// Size is the number of mapped bytes (the sum of the chunk lengths).
func (m *Mapping) Size() int64 { return m.size }

// ReadAt copies mapped bytes at off into p (device to host).
func (m *Mapping) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, fmt.Errorf("cuda: mapping read at negative offset %d", off)
	}
	if off >= m.size {
		return 0, io.EOF
	}
	n := int(min(int64(len(p)), m.size-off))
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed {
		return 0, errClosed
	}
	if err := m.reader.read(p[:n], m.base+uint64(off)); err != nil {
		return 0, fmt.Errorf("cuda: mapping read %d bytes at %d: %w", n, off, err)
	}
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// Close unmaps the chunks and frees the address range (the context stays,
// see mapContexts). Closing twice is a no-op.
func (m *Mapping) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil
	}
	m.closed = true
	err := errors.Join(m.reader.close(), m.unmap(len(m.lens)))
	if err != nil {
		return fmt.Errorf("cuda: close mapping: %w", err)
	}
	return nil
}
