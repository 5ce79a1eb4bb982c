package cuda

import (
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/gpu"
)

var (
	_ gpu.Region   = (*Region)(nil)
	_ gpu.Importer = (*Device)(nil)
)

// Region is one file's staged bytes: one or more VMM allocations (cuMemCreate,
// pinned, exportable as POSIX fds) mapped back to back in one reserved
// virtual address range.
type Region struct {
	dev     *Device
	size    int64    // bytes asked for
	chunks  []int64  // chunk lengths, in mapping order
	handles []uint64 // one CUmemGenericAllocationHandle per chunk
	base    uint64   // start of the reserved range
	total   int64    // sum of chunks

	// mu is held shared by every use of the mapping and exclusively by
	// Free, so memory is never unmapped under a copy. Lock order when two
	// Regions are held: lower base first (rlockPair).
	mu    sync.RWMutex
	freed bool

	regMu      sync.Mutex // guards registered
	registered bool       // chunks registered with cuFileBufRegister (gds mode)

	exported atomic.Bool // a chunk left this process: never pooled again

	// imported: the descriptors an imported region came from, one per
	// chunk, which Export hands out again (the driver refuses to export
	// a handle it imported). Closed by destroy.
	imported []*os.File

	// exports: the descriptors of the first Export, one per chunk, kept
	// (within keptExportsMax for all regions) so that later Exports are
	// duplicates: exporting a handle costs a driver call per chunk on every
	// first lease of a file, duplicating a descriptor does not. Set under
	// expMu; closed by destroy.
	expMu   sync.Mutex
	exports []*os.File

	accessMu sync.Mutex       // guards access
	access   map[*Device]bool // other devices granted access (peer copies)
}

// Alloc returns a Region of at least size bytes, split into chunks of at
// most the device's chunk size. On CUDA_ERROR_OUT_OF_MEMORY the error wraps
// gpu.ErrOutOfMemory. Partial work is undone on any failure.
func (d *Device) Alloc(size int64) (gpu.Region, error) {
	if size < 0 {
		return nil, fmt.Errorf("cuda: alloc: negative size %d", size)
	}
	if err := d.check(); err != nil {
		return nil, err
	}
	if gpu.RoundUp(size, d.gran) > d.total {
		return nil, fmt.Errorf("cuda: alloc %d bytes on %s with %d bytes of memory: %w",
			size, d.name, d.total, gpu.ErrOutOfMemory)
	}
	r := &Region{dev: d, size: size, chunks: gpu.SplitChunks(size, d.chunkSize, d.gran)}
	for _, c := range r.chunks {
		r.total += c
	}
	if err := r.create(); err != nil {
		return nil, fmt.Errorf("cuda: alloc %d bytes on %s: %w", size, d.name, err)
	}
	return r, nil
}

// create makes (or takes ready from the pool), maps and opens each chunk,
// and zeroes what lies past the file's end, undoing everything on failure.
func (r *Region) create() error {
	ctx := r.dev.ctx
	for i, c := range r.chunks {
		if h, ok := r.dev.takeChunk(c); ok {
			r.handles = append(r.handles, h)
			continue
		}
		h, err := ctx.memCreate(c)
		if err != nil {
			r.destroy(0, false)
			return fmt.Errorf("chunk %d of %d (%d bytes): %w", i, len(r.chunks), c, err)
		}
		r.handles = append(r.handles, h)
	}
	if err := r.mapHandles(); err != nil {
		return err
	}
	// The load writes [0, size); the rest of the last chunk would show
	// consumers whatever that memory held before (another file's bytes,
	// from this process).
	if r.total > r.size {
		if err := ctx.memsetZero(r.base+uint64(r.size), r.total-r.size); err != nil {
			r.destroy(len(r.chunks), true)
			return fmt.Errorf("zero the %d bytes past the end: %w", r.total-r.size, err)
		}
	}
	return nil
}

// mapHandles reserves the address range and maps r.handles into it back
// to back, readable and writable by r's device; on failure it undoes
// everything, releasing the handles too.
func (r *Region) mapHandles() error {
	ctx := r.dev.ctx
	base, err := ctx.reserve(r.total)
	if err != nil {
		r.destroy(0, false)
		return fmt.Errorf("reserve %d bytes: %w", r.total, err)
	}
	r.base = base
	off := r.base
	for i, c := range r.chunks {
		if err := ctx.mapMem(off, c, r.handles[i]); err != nil {
			r.destroy(i, true)
			return fmt.Errorf("map chunk %d of %d: %w", i, len(r.chunks), err)
		}
		off += uint64(c)
	}
	off = r.base
	for i, c := range r.chunks {
		if err := ctx.setAccess(off, c); err != nil {
			r.destroy(len(r.chunks), true)
			return fmt.Errorf("set access on chunk %d of %d: %w", i, len(r.chunks), err)
		}
		off += uint64(c)
	}
	return nil
}

// Import maps the chunks another process exported (Region.Export, POSIX
// file descriptors) into this process as Alloc maps its own: a handle per
// chunk (cuMemImportFromShareableHandle), one reserved range, read-write
// access for this device. The files stay the caller's: the handles keep
// the memory. Nothing is written: the exporter zeroed the tail. The
// region is marked exported, so Free releases its handles instead of
// pooling memory another process shares.
func (d *Device) Import(files []*os.File, chunks []int64, size int64) (gpu.Region, error) {
	if err := d.check(); err != nil {
		return nil, err
	}
	if len(files) == 0 || len(files) != len(chunks) {
		return nil, fmt.Errorf("cuda: import: %d descriptors for %d chunks", len(files), len(chunks))
	}
	r := &Region{dev: d, size: size, chunks: slices.Clone(chunks)}
	r.exported.Store(true)
	for i, c := range chunks {
		if c <= 0 || c%d.gran != 0 {
			return nil, fmt.Errorf("cuda: import: chunk %d of %d bytes: not a positive multiple of the granularity %d", i, c, d.gran)
		}
		r.total += c
	}
	if r.total < max(size, 1) {
		return nil, fmt.Errorf("cuda: import: chunks of %d bytes in all for %d bytes", r.total, size)
	}
	for i, f := range files {
		h, err := d.ctx.importFD(int(f.Fd()))
		var kept *os.File
		if err == nil {
			kept, err = dupFile(f)
			if err != nil {
				d.ctx.memRelease(h)
			}
		}
		if err != nil {
			r.destroy(0, false)
			return nil, fmt.Errorf("cuda: import chunk %d of %d on %s: %w", i, len(files), d.name, err)
		}
		r.handles = append(r.handles, h)
		r.imported = append(r.imported, kept)
	}
	runtime.KeepAlive(files)
	if err := r.mapHandles(); err != nil {
		return nil, fmt.Errorf("cuda: import %d bytes on %s: %w", size, d.name, err)
	}
	return r, nil
}

// destroy unmaps the first mapped chunks, frees the reserved range when
// reserved, and releases every handle. It returns every error it met.
func (r *Region) destroy(mapped int, reserved bool) error {
	ctx := r.dev.ctx
	var errs []error
	off := r.base
	for i := 0; i < mapped; i++ {
		errs = append(errs, ctx.unmap(off, r.chunks[i]))
		off += uint64(r.chunks[i])
	}
	if reserved {
		errs = append(errs, ctx.addressFree(r.base, r.total))
	}
	for i, h := range r.handles {
		if !r.exported.Load() && r.dev.putChunk(r.chunks[i], h) {
			continue
		}
		errs = append(errs, ctx.memRelease(h))
	}
	r.handles = nil
	for _, f := range r.imported {
		errs = append(errs, f.Close())
	}
	r.imported = nil
	for _, f := range r.exports {
		errs = append(errs, f.Close())
	}
	keptExports.Add(-int64(len(r.exports)))
	r.exports = nil
	return errors.Join(errs...)
}

// Size is the number of bytes asked for.
func (r *Region) Size() int64 { return r.size }

// Chunks returns the length of each chunk, in mapping order.
func (r *Region) Chunks() []int64 { return slices.Clone(r.chunks) }

// DevicePtr is the device address of the first byte (for tests and bench).
func (r *Region) DevicePtr() uint64 { return r.base }

// Seal is a no-op on CUDA.
func (r *Region) Seal() error { return nil }

// rlock takes r.mu shared and fails when r was freed.
func (r *Region) rlock() error {
	r.mu.RLock()
	if r.freed {
		r.mu.RUnlock()
		return errClosed
	}
	return nil
}

// rlockPair read-locks two distinct regions, lower base first.
func rlockPair(a, b *Region) (unlock func(), err error) {
	if a.base > b.base {
		a, b = b, a
	}
	if err := a.rlock(); err != nil {
		return nil, err
	}
	if err := b.rlock(); err != nil {
		a.mu.RUnlock()
		return nil, err
	}
	return func() { b.mu.RUnlock(); a.mu.RUnlock() }, nil
}

// Export returns one new POSIX file descriptor per chunk, which the
// caller closes: a duplicate of the descriptor the chunk was exported as
// first (cuMemExportToShareableHandle, kept by the region while
// keptExports allows) or, for an imported region, of the descriptor it
// came from.
func (r *Region) Export() ([]*os.File, error) {
	if err := r.rlock(); err != nil {
		return nil, err
	}
	defer r.mu.RUnlock()
	r.exported.Store(true)
	src := r.imported
	if src == nil {
		r.expMu.Lock()
		defer r.expMu.Unlock()
		if r.exports == nil {
			files, err := r.exportHandles()
			if err != nil {
				return nil, err
			}
			if !keepExports(len(files)) {
				return files, nil
			}
			r.exports = files
		}
		src = r.exports
	}
	files := make([]*os.File, 0, len(src))
	for i, f := range src {
		d, err := dupFile(f)
		if err != nil {
			closeFiles(files)
			return nil, fmt.Errorf("cuda: export chunk %d of %d: %w", i, len(src), err)
		}
		files = append(files, d)
	}
	return files, nil
}

// exportHandles exports each chunk's handle as a new descriptor.
func (r *Region) exportHandles() ([]*os.File, error) {
	files := make([]*os.File, 0, len(r.handles))
	for i, h := range r.handles {
		fd, err := r.dev.ctx.exportFD(h)
		if err != nil {
			closeFiles(files)
			return nil, fmt.Errorf("cuda: export chunk %d of %d: %w", i, len(r.handles), err)
		}
		files = append(files, os.NewFile(uintptr(fd), fmt.Sprintf("cuda:%s:chunk%d", r.dev.name, i)))
	}
	return files, nil
}

func closeFiles(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}

// keptExports counts the descriptors regions keep from their first
// Export, on every device; keptExportsMax bounds it (a sixteenth of the
// descriptor limit, at most 1024), inside the quarter of the limit the
// cache leaves to everything but source files (staging's descriptor
// budget). Past it an Export is not kept: the next one exports again.
var (
	keptExports    atomic.Int64
	keptExportsMax = sync.OnceValue(func() int64 {
		var rl unix.Rlimit
		if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
			return 0
		}
		return int64(min(rl.Cur/16, 1024))
	})
)

// keepExports counts n more kept descriptors, if they fit.
func keepExports(n int) bool {
	if keptExports.Add(int64(n)) <= keptExportsMax() {
		return true
	}
	keptExports.Add(-int64(n))
	return false
}

// dupFile is a close-on-exec duplicate of f.
func dupFile(f *os.File) (*os.File, error) {
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	runtime.KeepAlive(f)
	if err != nil {
		return nil, fmt.Errorf("dup %s: %w", f.Name(), err)
	}
	return os.NewFile(uintptr(fd), f.Name()), nil
}

// ReadAt copies device bytes at off into p, synchronously.
func (r *Region) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, fmt.Errorf("cuda: read at negative offset %d", off)
	}
	if off >= r.size {
		return 0, io.EOF
	}
	n := int(min(int64(len(p)), r.size-off))
	if err := r.rlock(); err != nil {
		return 0, err
	}
	defer r.mu.RUnlock()
	if err := r.dev.reader.read(p[:n], r.base+uint64(off)); err != nil {
		return 0, fmt.Errorf("cuda: read %d bytes at %d: %w", n, off, err)
	}
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// Free deregisters the chunks from cuFile (gds mode), unmaps them, frees
// the address range and releases the allocations. Exported descriptors stay
// valid until their holders close them. Freeing twice is a no-op.
func (r *Region) Free() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.freed {
		return nil
	}
	r.freed = true
	var errs []error
	r.regMu.Lock()
	if r.registered {
		r.forEachChunk(func(base uint64, _ int64) {
			errs = append(errs, r.dev.ctx.cufileBufDeregister(base))
		})
		r.registered = false
	}
	r.regMu.Unlock()
	errs = append(errs, r.destroy(len(r.chunks), true))
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("cuda: free region of %d bytes: %w", r.size, err)
	}
	return nil
}

// forEachChunk calls fn with each chunk's device address and length.
func (r *Region) forEachChunk(fn func(base uint64, n int64)) {
	off := r.base
	for _, c := range r.chunks {
		fn(off, c)
		off += uint64(c)
	}
}
