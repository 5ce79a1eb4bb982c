package chunkmap

import (
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"
)

// CUDA chunks, over the CUDA driver API loaded at run time (dlopen of
// libcuda.so.1 through purego: no cgo, no toolkit): import each chunk
// descriptor, reserve one address range, map the chunks back to back,
// grant the device access, release the handles. Every call runs on a
// locked OS thread with the device's primary context made current (the
// one torch and cupy use), retained for the life of the process.

// CUDA driver constants (cuda.h).
const (
	cuMemHandleTypePosixFD   = 1 // CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
	cuMemLocationTypeDevice  = 1 // CU_MEM_LOCATION_TYPE_DEVICE
	cuMemAccessProtRead      = 1 // CU_MEM_ACCESS_FLAGS_PROT_READ
	cuMemAccessProtReadWrite = 3 // CU_MEM_ACCESS_FLAGS_PROT_READWRITE
)

var cuErrorNames = map[int32]string{
	1: "CUDA_ERROR_INVALID_VALUE", 2: "CUDA_ERROR_OUT_OF_MEMORY", 3: "CUDA_ERROR_NOT_INITIALIZED",
	4: "CUDA_ERROR_DEINITIALIZED", 100: "CUDA_ERROR_NO_DEVICE", 101: "CUDA_ERROR_INVALID_DEVICE",
	201: "CUDA_ERROR_INVALID_CONTEXT", 304: "CUDA_ERROR_OPERATING_SYSTEM", 400: "CUDA_ERROR_INVALID_HANDLE",
	700: "CUDA_ERROR_ILLEGAL_ADDRESS", 801: "CUDA_ERROR_NOT_SUPPORTED", 999: "CUDA_ERROR_UNKNOWN",
}

// cuError is a failed driver call.
type cuError struct {
	op   string
	code int32
}

func (e *cuError) Error() string {
	name := cuErrorNames[e.code]
	if name == "" {
		name = "CUresult"
	}
	return fmt.Sprintf("%s: %s (%d)", e.op, name, e.code)
}

// cuLib is libcuda.so.1's entry points.
type cuLib struct {
	init, deviceGetCount, deviceGet, deviceGetUUID, primaryCtxRetain, ctxSetCurrent, ctxSynchronize uintptr
	memImport, memRelease, memReserve, memAddressFree, memMap, memUnmap, memSetAccess, memcpyDtoH   uintptr
}

var cu struct {
	once sync.Once
	lib  *cuLib
	err  error

	mu   sync.Mutex
	devs map[string]*cuDevice // by "GPU-<uuid>"; contexts retained for the process's life
}

func openCU() (*cuLib, error) {
	h, err := purego.Dlopen("libcuda.so.1", purego.RTLD_NOW|purego.RTLD_GLOBAL)
	if err != nil {
		return nil, fmt.Errorf("the lease lives on a GPU but the CUDA driver (libcuda.so.1) cannot be loaded: %w", err)
	}
	l := &cuLib{}
	for _, s := range []struct {
		p     *uintptr
		names []string
	}{
		{&l.init, []string{"cuInit"}}, {&l.deviceGetCount, []string{"cuDeviceGetCount"}},
		{&l.deviceGet, []string{"cuDeviceGet"}}, {&l.deviceGetUUID, []string{"cuDeviceGetUuid_v2", "cuDeviceGetUuid"}},
		{&l.primaryCtxRetain, []string{"cuDevicePrimaryCtxRetain"}}, {&l.ctxSetCurrent, []string{"cuCtxSetCurrent"}},
		{&l.ctxSynchronize, []string{"cuCtxSynchronize"}},
		{&l.memImport, []string{"cuMemImportFromShareableHandle"}}, {&l.memRelease, []string{"cuMemRelease"}},
		{&l.memReserve, []string{"cuMemAddressReserve"}}, {&l.memAddressFree, []string{"cuMemAddressFree"}},
		{&l.memMap, []string{"cuMemMap"}}, {&l.memUnmap, []string{"cuMemUnmap"}},
		{&l.memSetAccess, []string{"cuMemSetAccess"}}, {&l.memcpyDtoH, []string{"cuMemcpyDtoH_v2"}},
	} {
		for _, n := range s.names {
			if p, err := purego.Dlsym(h, n); err == nil && p != 0 {
				*s.p = p
				break
			}
		}
		if *s.p == 0 {
			return nil, fmt.Errorf("libcuda.so.1 lacks %s (driver too old?)", strings.Join(s.names, " / "))
		}
	}
	if err := l.check("cuInit", l.init, 0); err != nil {
		return nil, err
	}
	return l, nil
}

// call runs a driver function; arguments that are pointers converted in
// the call expression stay alive and in place for the call.
//
//go:uintptrescapes
func (l *cuLib) call(fn uintptr, args ...uintptr) int32 {
	r, _, _ := purego.SyscallN(fn, args...)
	return int32(r)
}

//go:uintptrescapes
func (l *cuLib) check(op string, fn uintptr, args ...uintptr) error {
	if r, _, _ := purego.SyscallN(fn, args...); int32(r) != 0 {
		return &cuError{op: op, code: int32(r)}
	}
	return nil
}

// cuDevice is a device and its retained primary context (the one torch
// and cupy use).
type cuDevice struct {
	name string
	dev  int32
	ctx  uintptr
}

// device finds the device named "GPU-<uuid>" among this process's devices
// (CUDA_VISIBLE_DEVICES applies) and retains its primary context, once.
func device(name string) (*cuLib, *cuDevice, error) {
	cu.once.Do(func() { cu.lib, cu.err = openCU() })
	if cu.err != nil {
		return nil, nil, cu.err
	}
	l := cu.lib
	cu.mu.Lock()
	defer cu.mu.Unlock()
	if d := cu.devs[name]; d != nil {
		return l, d, nil
	}
	var n int32
	if err := l.check("cuDeviceGetCount", l.deviceGetCount, uintptr(unsafe.Pointer(&n))); err != nil {
		return nil, nil, err
	}
	var seen []string
	for i := int32(0); i < n; i++ {
		var dev int32
		var uuid [16]byte
		if err := l.check("cuDeviceGet", l.deviceGet, uintptr(unsafe.Pointer(&dev)), uintptr(i)); err != nil {
			return nil, nil, err
		}
		if err := l.check("cuDeviceGetUuid", l.deviceGetUUID, uintptr(unsafe.Pointer(&uuid)), uintptr(dev)); err != nil {
			return nil, nil, err
		}
		got := formatUUID(uuid)
		if !strings.EqualFold(got, name) {
			seen = append(seen, got)
			continue
		}
		var ctx uintptr
		if err := l.check("cuDevicePrimaryCtxRetain", l.primaryCtxRetain, uintptr(unsafe.Pointer(&ctx)), uintptr(dev)); err != nil {
			return nil, nil, err
		}
		d := &cuDevice{name: name, dev: dev, ctx: ctx}
		if cu.devs == nil {
			cu.devs = map[string]*cuDevice{}
		}
		cu.devs[name] = d
		return l, d, nil
	}
	return nil, nil, fmt.Errorf("the lease lives on %s, which is not among this process's %d CUDA devices %v (CUDA_VISIBLE_DEVICES=%q)",
		name, n, seen, os.Getenv("CUDA_VISIBLE_DEVICES"))
}

// FirstCUDADevice is the name ("GPU-<uuid>") of this process's CUDA
// device 0 (CUDA_VISIBLE_DEVICES applies); "" when there is none.
func FirstCUDADevice() (string, error) {
	cu.once.Do(func() { cu.lib, cu.err = openCU() })
	if cu.err != nil {
		return "", cu.err
	}
	l := cu.lib
	var n, dev int32
	if err := l.check("cuDeviceGetCount", l.deviceGetCount, uintptr(unsafe.Pointer(&n))); err != nil || n == 0 {
		return "", err
	}
	var uuid [16]byte
	if err := l.check("cuDeviceGet", l.deviceGet, uintptr(unsafe.Pointer(&dev)), 0); err != nil {
		return "", err
	}
	if err := l.check("cuDeviceGetUuid", l.deviceGetUUID, uintptr(unsafe.Pointer(&uuid)), uintptr(dev)); err != nil {
		return "", err
	}
	return formatUUID(uuid), nil
}

// formatUUID is nvidia-smi's form: GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx.
func formatUUID(b [16]byte) string {
	return fmt.Sprintf("GPU-%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// on runs fn on a locked OS thread with d's context current.
func (d *cuDevice) on(l *cuLib, fn func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := l.check("cuCtxSetCurrent", l.ctxSetCurrent, d.ctx); err != nil {
		return err
	}
	return fn()
}

// CUDAMapping is a file's chunks imported and mapped at one device
// address.
type CUDAMapping struct {
	l        *cuLib
	d        *cuDevice
	base     uint64
	lens     []int64
	total    int64
	size     int64
	readOnly bool

	mu     sync.RWMutex // shared by reads, exclusive in Close
	closed bool
}

// accessDesc is CUmemAccessDesc: {CUmemLocation{type, id}, flags}.
type accessDesc struct {
	locType, locID, flags int32
}

var _ Mapping = (*CUDAMapping)(nil)

// CUDA maps chunk descriptors exported from the device named name
// ("GPU-<uuid>") contiguously; see Map. A read-only mapping the driver
// refuses (some drivers do not grant read-only access to device memory)
// is made read-write, and ReadOnly then says false.
func CUDA(name string, files []*os.File, lens []int64, size int64, writable bool) (*CUDAMapping, error) {
	total, err := check(files, lens, size)
	if err != nil {
		return nil, fmt.Errorf("map on %s: %w", name, err)
	}
	l, d, err := device(name)
	if err != nil {
		return nil, err
	}
	m := &CUDAMapping{l: l, d: d, lens: append([]int64(nil), lens...), total: total, size: size, readOnly: !writable}
	if err := d.on(l, func() error { return m.build(files) }); err != nil {
		return nil, fmt.Errorf("map %d chunks on %s: %w", len(files), name, err)
	}
	return m, nil
}

// build imports, maps and opens each chunk; on failure it undoes all of
// it. Handles are released once mapped: the mapping keeps the memory.
func (m *CUDAMapping) build(files []*os.File) error {
	l := m.l
	handles := make([]uint64, 0, len(files))
	defer func() {
		for _, h := range handles {
			l.call(l.memRelease, uintptr(h))
		}
	}()
	for i, f := range files {
		var h uint64
		if err := l.check("cuMemImportFromShareableHandle", l.memImport, uintptr(unsafe.Pointer(&h)), f.Fd(), cuMemHandleTypePosixFD); err != nil {
			return fmt.Errorf("chunk %d: %w", i, err)
		}
		handles = append(handles, h)
	}
	runtime.KeepAlive(files)
	var base uint64
	if err := l.check("cuMemAddressReserve", l.memReserve, uintptr(unsafe.Pointer(&base)), uintptr(m.total), 0, 0, 0); err != nil {
		return err
	}
	m.base = base
	mapped, err := m.mapAll(handles)
	if err != nil {
		m.unmap(mapped)
		return err
	}
	return nil
}

// mapAll maps each chunk and sets its access: read-only for a shared
// grant. A driver that refuses read-only access on device memory
// (CUDA_ERROR_INVALID_VALUE or NOT_SUPPORTED) gets read-write, and
// ReadOnly then says false.
func (m *CUDAMapping) mapAll(handles []uint64) (int, error) {
	l := m.l
	flags := int32(cuMemAccessProtReadWrite)
	if m.readOnly {
		flags = cuMemAccessProtRead
	}
	off := m.base
	for i, h := range handles {
		if err := l.check("cuMemMap", l.memMap, uintptr(off), uintptr(m.lens[i]), 0, uintptr(h), 0); err != nil {
			return i, fmt.Errorf("chunk %d: %w", i, err)
		}
		err := m.setAccess(off, m.lens[i], flags)
		var ce *cuError
		if err != nil && i == 0 && flags == cuMemAccessProtRead && errors.As(err, &ce) && (ce.code == 1 || ce.code == 801) {
			flags, m.readOnly = cuMemAccessProtReadWrite, false
			err = m.setAccess(off, m.lens[i], flags)
		}
		if err != nil {
			return i + 1, fmt.Errorf("chunk %d (access flags %d): %w", i, flags, err)
		}
		off += uint64(m.lens[i])
	}
	return len(handles), nil
}

func (m *CUDAMapping) setAccess(ptr uint64, n int64, flags int32) error {
	desc := &accessDesc{locType: cuMemLocationTypeDevice, locID: m.d.dev, flags: flags}
	return m.l.check("cuMemSetAccess", m.l.memSetAccess, uintptr(ptr), uintptr(n), uintptr(unsafe.Pointer(desc)), 1)
}

// unmap unmaps the first mapped chunks and frees the range.
func (m *CUDAMapping) unmap(mapped int) error {
	l := m.l
	var errs []error
	off := m.base
	for i := 0; i < mapped; i++ {
		if err := l.check("cuMemUnmap", l.memUnmap, uintptr(off), uintptr(m.lens[i])); err != nil {
			errs = append(errs, err)
		}
		off += uint64(m.lens[i])
	}
	if err := l.check("cuMemAddressFree", l.memAddressFree, uintptr(m.base), uintptr(m.total)); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Ptr is the device address of the first byte.
func (m *CUDAMapping) Ptr() uint64 { return m.base }

// Size is the file size.
func (m *CUDAMapping) Size() int64 { return m.size }

// ReadOnly says whether the device refuses writes through the mapping.
func (m *CUDAMapping) ReadOnly() bool { return m.readOnly }

// ReadAt copies mapped bytes to p (device to host).
func (m *CUDAMapping) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 || off > m.size {
		return 0, fmt.Errorf("read at %d: outside %d bytes", off, m.size)
	}
	n := int(min(int64(len(p)), m.size-off))
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed {
		return 0, os.ErrClosed
	}
	if n > 0 {
		err := m.d.on(m.l, func() error {
			return m.l.check("cuMemcpyDtoH_v2", m.l.memcpyDtoH, uintptr(unsafe.Pointer(&p[0])), uintptr(m.base+uint64(off)), uintptr(n))
		})
		if err != nil {
			return 0, err
		}
	}
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// Close waits for the context's work (a kernel may still read the range),
// then unmaps and frees it. The context stays retained.
func (m *CUDAMapping) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil
	}
	m.closed = true
	return m.d.on(m.l, func() error {
		return errors.Join(m.l.check("cuCtxSynchronize", m.l.ctxSynchronize), m.unmap(len(m.lens)))
	})
}
