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
	name      string // "host", or "hostN" when there are several
	index     int    // -1 for the one host device; N for hostN
}

var (
	_ gpu.Device   = (*Device)(nil)
	_ gpu.Peer     = (*Device)(nil)
	_ gpu.Importer = (*Device)(nil)
)

// Open returns the host device. opts.ChunkSize bounds one memfd.
func Open(opts gpu.Options) *Device {
	return &Device{chunkSize: opts.ChunkSize, page: int64(os.Getpagesize()), name: gpu.KindHost, index: -1}
}

// OpenN returns n host devices, named host0 .. host<n-1> (one device, for
// n == 1, is "host"): separate places with separate capacities, so
// placement, replicas and eviction per device run without a GPU.
func OpenN(opts gpu.Options, n int) []*Device {
	if n <= 1 {
		return []*Device{Open(opts)}
	}
	out := make([]*Device, n)
	for i := range out {
		out[i] = Open(opts)
		out[i].name, out[i].index = fmt.Sprintf("%s%d", gpu.KindHost, i), i
	}
	return out
}

// Kind is gpu.KindHost.
func (d *Device) Kind() string { return gpu.KindHost }

// Name is "host", or "hostN" for one of several.
func (d *Device) Name() string { return d.name }

// Ordinal is N for hostN, and -1 for the one host device: there is no
// CUDA device.
func (d *Device) Ordinal() int { return d.index }

// Granularity is the page size.
func (d *Device) Granularity() int64 { return d.page }

// MemInfo reports MemAvailable and MemTotal.
func (d *Device) MemInfo() (free, total int64, err error) {
	return memInfo()
}

// HeldDescriptors is the number of chunks: each is a memfd held open.
func (d *Device) HeldDescriptors(size int64) int {
	return len(gpu.SplitChunks(size, d.chunkSize, d.page))
}

// Alloc creates one memfd per chunk. The daemon writes and reads them with
// pwrite and pread (much faster than through a shared mapping, whose page
// faults dominate); consumers map them.
func (d *Device) Alloc(size int64) (gpu.Region, error) {
	if size < 0 {
		return nil, fmt.Errorf("alloc %d bytes: negative size", size)
	}
	r := &Region{size: size, lens: gpu.SplitChunks(size, d.chunkSize, d.page)}
	for i, c := range r.lens {
		f, err := newChunk(fmt.Sprintf("gdsfs-%d", i), c)
		if err != nil {
			r.Free()
			return nil, fmt.Errorf("alloc %d bytes: chunk %d: %w", size, i, mapErr(err))
		}
		r.files = append(r.files, f)
	}
	return r, nil
}

// Import takes over the memfds of a sealed region (another daemon's
// Region.Export): each must be a memfd of exactly its chunk's length with
// every seal Seal sets, so nobody can write it, the exporter included.
// The Region holds duplicates; files stay the caller's.
func (d *Device) Import(files []*os.File, chunks []int64, size int64) (gpu.Region, error) {
	if err := checkLayout(len(files), chunks, size, d.page); err != nil {
		return nil, fmt.Errorf("import: %w", err)
	}
	r := &Region{size: size, lens: append([]int64(nil), chunks...), sealed: true}
	for i, f := range files {
		dup, err := importChunk(f, chunks[i])
		if err != nil {
			r.Free()
			return nil, fmt.Errorf("import: chunk %d of %d: %w", i, len(files), err)
		}
		r.files = append(r.files, dup)
	}
	return r, nil
}

// checkLayout checks that n descriptors of the lengths chunks, each a
// whole number of pages, hold size bytes and no chunk more than they
// need.
func checkLayout(n int, chunks []int64, size, page int64) error {
	if n == 0 || n != len(chunks) {
		return fmt.Errorf("%d descriptors for %d chunks", n, len(chunks))
	}
	var total int64
	for i, c := range chunks {
		if c <= 0 || c%page != 0 {
			return fmt.Errorf("chunk %d of %d bytes: not a positive multiple of the page (%d)", i, c, page)
		}
		total += c
	}
	if need := max(size, 1); total < need || total-chunks[len(chunks)-1] >= need {
		return fmt.Errorf("chunks of %d bytes in all for %d bytes", total, size)
	}
	return nil
}

// importChunk checks that f is a sealed memfd of n bytes and returns a
// duplicate of it.
func importChunk(f *os.File, n int64) (*os.File, error) {
	seals, err := unix.FcntlInt(f.Fd(), unix.F_GET_SEALS, 0)
	if err != nil {
		return nil, fmt.Errorf("F_GET_SEALS (not a memfd?): %w", err)
	}
	if want := unix.F_SEAL_WRITE | unix.F_SEAL_GROW | unix.F_SEAL_SHRINK; seals&want != want {
		return nil, fmt.Errorf("not sealed (seals %#x): its bytes may still change", seals)
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return nil, fmt.Errorf("fstat: %w", err)
	}
	if st.Size != n {
		return nil, fmt.Errorf("holds %d bytes, the chunk %d", st.Size, n)
	}
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("dup: %w", err)
	}
	return os.NewFile(uintptr(fd), f.Name()), nil
}

// NewWorker returns a worker whose copies are plain memory copies.
func (d *Device) NewWorker(bufSize int) (gpu.Worker, error) {
	if bufSize <= 0 {
		return nil, fmt.Errorf("worker buffer size %d: must be positive", bufSize)
	}
	// Page-aligned (mmap) so the loader can pread with O_DIRECT into them.
	var w worker
	for i := range w.bufs {
		b, err := unix.Mmap(-1, 0, bufSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_POPULATE)
		if err != nil {
			w.Close()
			return nil, fmt.Errorf("worker buffer of %d bytes: %w", bufSize, mapErr(err))
		}
		w.bufs[i] = b
	}
	return &w, nil
}

// Copy copies src into dst, 16 MiB at a time.
func (d *Device) Copy(dst, src gpu.Region) error {
	s, ok1 := src.(*Region)
	t, ok2 := dst.(*Region)
	if !ok1 || !ok2 {
		return fmt.Errorf("copy: region of another backend")
	}
	if t.size < s.size {
		return fmt.Errorf("copy: destination holds %d bytes, source %d", t.size, s.size)
	}
	return d.CopyRange(dst, 0, src, 0, s.size)
}

// PeerAccess is true for any host device: regions are memory of one
// process.
func (d *Device) PeerAccess(other gpu.Device) (bool, string) {
	if _, ok := other.(*Device); !ok {
		return false, fmt.Sprintf("%s is not a host device", other.Name())
	}
	return true, ""
}

// CopyRange copies n bytes at srcOff of src to dstOff of dst, 16 MiB at a
// time (the host backend's peer copy: a memcpy between regions).
func (d *Device) CopyRange(dst gpu.Region, dstOff int64, src gpu.Region, srcOff, n int64) error {
	s, ok1 := src.(*Region)
	t, ok2 := dst.(*Region)
	if !ok1 || !ok2 {
		return fmt.Errorf("copy: region of another backend")
	}
	if srcOff < 0 || n < 0 || srcOff+n > s.size {
		return fmt.Errorf("copy %d bytes at %d: outside the source's %d bytes", n, srcOff, s.size)
	}
	buf := make([]byte, min(16<<20, max(n, 1)))
	for done := int64(0); done < n; done += int64(len(buf)) {
		k := min(int64(len(buf)), n-done)
		if _, err := s.ReadAt(buf[:k], srcOff+done); err != nil {
			return fmt.Errorf("copy: %w", err)
		}
		if err := t.writeAt(buf[:k], dstOff+done); err != nil {
			return fmt.Errorf("copy: %w", err)
		}
	}
	return nil
}

// CuFile is never available on the host backend.
func (d *Device) CuFile() (gpu.CuFile, string) { return nil, "host backend has no cuFile" }

// Close does nothing: memfds are freed with their regions.
func (d *Device) Close() error { return nil }

// Region is a file's chunks: one memfd each.
type Region struct {
	size int64
	lens []int64

	mu     sync.RWMutex // guards the fields below; writers: Seal, Free
	files  []*os.File   // nil once freed
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
	if r.files == nil {
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
	if off < 0 || off > r.size {
		return 0, fmt.Errorf("read at %d: outside region of %d bytes", off, r.size)
	}
	want := len(p)
	if int64(want) > r.size-off {
		want = int(r.size - off)
	}
	n, err := r.chunkIO(p[:want], off, unix.Pread, false)
	if err == nil && n < len(p) {
		err = fmt.Errorf("read %d bytes at %d: region holds %d", len(p), off, r.size)
	}
	return n, err
}

// writeAt copies p into the region; fails once sealed.
func (r *Region) writeAt(p []byte, off int64) error {
	if off < 0 || off+int64(len(p)) > r.size {
		return fmt.Errorf("write %d bytes at %d: outside region of %d bytes", len(p), off, r.size)
	}
	_, err := r.chunkIO(p, off, func(fd int, b []byte, o int64) (int, error) { return unix.Pwrite(fd, b, o) }, true)
	return err
}

// chunkIO runs io over the chunks that [off, off+len(p)) spans.
func (r *Region) chunkIO(p []byte, off int64, io func(int, []byte, int64) (int, error), write bool) (int, error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if r.files == nil || (write && r.sealed) {
		return 0, fmt.Errorf("region freed or sealed")
	}
	done := 0
	base := int64(0)
	for i, l := range r.lens {
		if done == len(p) {
			break
		}
		if off+int64(done) >= base+l {
			base += l
			continue
		}
		inner := off + int64(done) - base
		part := p[done:min(len(p), done+int(l-inner))]
		for len(part) > 0 {
			n, err := io(int(r.files[i].Fd()), part, inner)
			if err != nil {
				return done, fmt.Errorf("chunk %d at %d: %w", i, inner, err)
			}
			if n == 0 {
				return done, fmt.Errorf("chunk %d at %d: short transfer", i, inner)
			}
			part, inner, done = part[n:], inner+int64(n), done+n
		}
		base += l
	}
	return done, nil
}

// Seal forbids any further change to the memfds: writes, writable
// mappings, growth and shrinking, anywhere.
func (r *Region) Seal() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.files == nil {
		return fmt.Errorf("seal: region freed")
	}
	if r.sealed {
		return nil
	}
	for i, f := range r.files {
		seals := unix.F_SEAL_WRITE | unix.F_SEAL_GROW | unix.F_SEAL_SHRINK | unix.F_SEAL_SEAL
		if _, err := unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, seals); err != nil {
			return fmt.Errorf("seal: chunk %d: %w", i, err)
		}
	}
	r.sealed = true
	return nil
}

// Free closes the memfds; consumers' descriptors keep their bytes alive.
func (r *Region) Free() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	var first error
	for _, f := range r.files {
		if err := f.Close(); err != nil && first == nil {
			first = fmt.Errorf("free: %w", err)
		}
	}
	r.files = nil
	return first
}

type worker struct {
	bufs [2][]byte
	errs [2]error
}

func (w *worker) Buffer(i int) []byte { return w.bufs[i] }

// CopyAsync writes the buffer into the region (synchronously: "async" has
// nothing to overlap with on the host).
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
