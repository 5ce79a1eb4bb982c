// Package host is the gpu.Device backend with no GPU: regions are memfds
// mapped contiguously in the daemon, so the staging pipeline, the export of
// chunks over SCM_RIGHTS and the consumers' read-only mappings all run on any
// Linux machine.
//
// A sealed region can no longer be written through any mapping, the daemon's
// included: consumers of a shared region see exactly the file's bytes.
package host

import (
	"fmt"
	"os"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/gpu"
)

// Device is host memory behind memfds.
type Device struct {
	chunkSize int64
	page      int64
}

var _ gpu.Device = (*Device)(nil)

// Open returns the host device. opts.ChunkSize bounds one memfd.
func Open(opts gpu.Options) *Device {
	return &Device{chunkSize: opts.ChunkSize, page: int64(os.Getpagesize())}
}

// Kind is gpu.KindHost.
func (d *Device) Kind() string { return gpu.KindHost }

// Name is "host".
func (d *Device) Name() string { return "host" }

// Ordinal is -1: there is no CUDA device.
func (d *Device) Ordinal() int { return -1 }

// Granularity is the page size.
func (d *Device) Granularity() int64 { return d.page }

// MemInfo reports MemAvailable and MemTotal.
func (d *Device) MemInfo() (free, total int64, err error) {
	return memInfo()
}

// Alloc creates one memfd per chunk and maps them contiguously.
func (d *Device) Alloc(size int64) (gpu.Region, error) {
	if size < 0 {
		return nil, fmt.Errorf("alloc %d bytes: negative size", size)
	}
	chunks := gpu.SplitChunks(size, d.chunkSize, d.page)
	var total int64
	for _, c := range chunks {
		total += c
	}
	// Reserve the whole range first, then map each memfd over its part.
	base, err := unix.Mmap(-1, 0, int(total), unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		return nil, fmt.Errorf("alloc %d bytes: reserve: %w", size, mapErr(err))
	}
	r := &Region{size: size, lens: chunks, mem: base}
	var off int64
	for i, c := range chunks {
		f, err := newChunk(fmt.Sprintf("gdsfs-%d", i), c)
		if err == nil {
			r.files = append(r.files, f)
			err = mapFixed(base[off:off+c], f, unix.PROT_READ|unix.PROT_WRITE)
		}
		if err != nil {
			r.Free()
			return nil, fmt.Errorf("alloc %d bytes: chunk %d: %w", size, i, mapErr(err))
		}
		off += c
	}
	return r, nil
}

// NewWorker returns a worker whose copies are plain memory copies.
func (d *Device) NewWorker(bufSize int) (gpu.Worker, error) {
	if bufSize <= 0 {
		return nil, fmt.Errorf("worker buffer size %d: must be positive", bufSize)
	}
	// Page-aligned (mmap) so the loader can pread with O_DIRECT into them.
	var w worker
	for i := range w.bufs {
		b, err := unix.Mmap(-1, 0, bufSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
		if err != nil {
			w.Close()
			return nil, fmt.Errorf("worker buffer of %d bytes: %w", bufSize, mapErr(err))
		}
		w.bufs[i] = b
	}
	return &w, nil
}

// Copy copies src into dst through the daemon's mappings.
func (d *Device) Copy(dst, src gpu.Region) error {
	s, ok1 := src.(*Region)
	t, ok2 := dst.(*Region)
	if !ok1 || !ok2 {
		return fmt.Errorf("copy: region of another backend")
	}
	if t.size < s.size {
		return fmt.Errorf("copy: destination holds %d bytes, source %d", t.size, s.size)
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	t.mu.RLock()
	defer t.mu.RUnlock()
	if s.mem == nil || t.mem == nil || t.sealed {
		return fmt.Errorf("copy: region freed or sealed")
	}
	copy(t.mem[:s.size], s.mem[:s.size])
	return nil
}

// CuFile is never available on the host backend.
func (d *Device) CuFile() (gpu.CuFile, string) { return nil, "host backend has no cuFile" }

// Close does nothing: memfds are freed with their regions.
func (d *Device) Close() error { return nil }

// Region is a set of memfds mapped contiguously.
type Region struct {
	size int64
	lens []int64

	mu     sync.RWMutex // guards the fields below; writers: Seal, Free
	mem    []byte       // the whole mapping; nil once freed
	files  []*os.File
	sealed bool
}

var _ gpu.Region = (*Region)(nil)

// Size is the number of bytes asked for.
func (r *Region) Size() int64 { return r.size }

// Chunks returns the memfd lengths.
func (r *Region) Chunks() []int64 { return append([]int64(nil), r.lens...) }

// Export duplicates the memfds.
func (r *Region) Export() ([]*os.File, error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if r.mem == nil {
		return nil, fmt.Errorf("export: region freed")
	}
	out := make([]*os.File, 0, len(r.files))
	for _, f := range r.files {
		fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			for _, o := range out {
				o.Close()
			}
			return nil, fmt.Errorf("export: dup: %w", err)
		}
		out = append(out, os.NewFile(uintptr(fd), f.Name()))
	}
	return out, nil
}

// ReadAt copies region bytes to p.
func (r *Region) ReadAt(p []byte, off int64) (int, error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if r.mem == nil {
		return 0, fmt.Errorf("read: region freed")
	}
	if off < 0 || off > r.size {
		return 0, fmt.Errorf("read at %d: outside region of %d bytes", off, r.size)
	}
	n := copy(p, r.mem[off:r.size])
	if n < len(p) {
		return n, fmt.Errorf("read %d bytes at %d: region holds %d", len(p), off, r.size)
	}
	return n, nil
}

// Bytes returns the daemon's mapping of the region (read-only once sealed).
// The slice is valid until Free.
func (r *Region) Bytes() []byte {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if r.mem == nil {
		return nil
	}
	return r.mem[:r.size]
}

// Seal remaps the region read-only and seals the memfds against writes,
// growth and shrinking, so no mapping anywhere can change the bytes.
func (r *Region) Seal() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.mem == nil {
		return fmt.Errorf("seal: region freed")
	}
	if r.sealed {
		return nil
	}
	var off int64
	for i, f := range r.files {
		part := r.mem[off : off+r.lens[i]]
		// Drop the daemon's writable mapping, then forbid new writable
		// mappings and write(2) everywhere (F_SEAL_FUTURE_WRITE: F_SEAL_WRITE
		// would still see this process's read-only MAP_SHARED of an O_RDWR
		// memfd as maybe-writable).
		if err := mapFixed(part, f, unix.PROT_READ); err != nil {
			return fmt.Errorf("seal: remap chunk %d: %w", i, err)
		}
		seals := unix.F_SEAL_FUTURE_WRITE | unix.F_SEAL_GROW | unix.F_SEAL_SHRINK | unix.F_SEAL_SEAL
		if _, err := unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, seals); err != nil {
			return fmt.Errorf("seal: chunk %d: %w", i, err)
		}
		off += r.lens[i]
	}
	r.sealed = true
	return nil
}

// Free unmaps the region and closes the memfds.
func (r *Region) Free() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	var first error
	if r.mem != nil {
		if err := unix.Munmap(r.mem); err != nil {
			first = fmt.Errorf("free: munmap: %w", err)
		}
		r.mem = nil
	}
	for _, f := range r.files {
		if err := f.Close(); err != nil && first == nil {
			first = fmt.Errorf("free: %w", err)
		}
	}
	r.files = nil
	return first
}

// writeAt copies p into the region; fails once sealed.
func (r *Region) writeAt(p []byte, off int64) error {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if r.mem == nil || r.sealed {
		return fmt.Errorf("write: region freed or sealed")
	}
	if off < 0 || off+int64(len(p)) > r.size {
		return fmt.Errorf("write %d bytes at %d: outside region of %d bytes", len(p), off, r.size)
	}
	copy(r.mem[off:], p)
	return nil
}

type worker struct {
	bufs [2][]byte
	errs [2]error
}

func (w *worker) Buffer(i int) []byte { return w.bufs[i] }

func (w *worker) CopyAsync(dst gpu.Region, off int64, i, n int) error {
	r, ok := dst.(*Region)
	if !ok {
		return fmt.Errorf("copy: region of another backend")
	}
	if n < 0 || n > len(w.bufs[i]) {
		return fmt.Errorf("copy %d bytes: buffer holds %d", n, len(w.bufs[i]))
	}
	w.errs[i] = r.writeAt(w.bufs[i][:n], off)
	return nil
}

func (w *worker) Wait(i int) error {
	err := w.errs[i]
	w.errs[i] = nil
	return err
}

func (w *worker) Close() error {
	for i, b := range w.bufs {
		if b != nil {
			unix.Munmap(b)
			w.bufs[i] = nil
		}
	}
	return nil
}
