package cuda

import (
	"errors"
	"fmt"
	"sync"

	"go.uber.org/zap"

	"github.com/gdsfs/gdsfs/gpu"
)

// DefaultChunkSize bounds one allocation when gpu.Options.ChunkSize is 0.
const DefaultChunkSize = 1 << 30

var _ gpu.Device = (*Device)(nil)

// Device is one CUDA GPU, reached through its primary context. All methods
// are safe for concurrent use.
type Device struct {
	log       *zap.Logger
	ctx       *cuContext
	ordinal   int
	name      string // "GPU-<uuid>"
	model     string // "NVIDIA H200"
	gran      int64
	chunkSize int64
	total     int64 // device memory, bytes

	cufile       *cuFile // nil when cuFile is unavailable
	cufileReason string

	reader *hostReader
	pool   *chunkPool // nil without warm chunks

	// mu guards closed only; it is never held across a driver call.
	mu     sync.Mutex
	closed bool

	// peerMu guards peers; it is held across enabling a pair's peer
	// access (once per pair, peer.go).
	peerMu sync.Mutex
	peers  map[*Device]string // peer device -> "" (access on) or why not
}

// Open opens CUDA device ordinal: it loads libcuda.so.1, retains the
// device's primary context, tries to open cuFile and reads the VMM
// allocation granularity. A missing library, symbol or device is an error,
// never a crash. A ChunkSize of 0 means DefaultChunkSize. log may be nil.
func Open(ordinal int, opts gpu.Options, log *zap.Logger) (*Device, error) {
	if log == nil {
		log = zap.NewNop()
	}
	log = log.Named("cuda")
	if opts.ChunkSize < 0 {
		return nil, fmt.Errorf("cuda: chunk size %d is negative", opts.ChunkSize)
	}
	if err := loadCUDA(); err != nil {
		return nil, fmt.Errorf("cuda: %w", err)
	}
	n, err := deviceCount()
	if err != nil {
		return nil, fmt.Errorf("cuda: %w", err)
	}
	if ordinal < 0 || ordinal >= n {
		return nil, fmt.Errorf("cuda: device %d does not exist (%d devices)", ordinal, n)
	}
	info, err := queryDevice(ordinal)
	if err != nil {
		return nil, fmt.Errorf("cuda: device %d: %w", ordinal, err)
	}
	ctx, err := retainContext(info)
	if err != nil {
		return nil, fmt.Errorf("cuda: device %d: %w", ordinal, err)
	}
	d := &Device{
		log:     log,
		ctx:     ctx,
		ordinal: ordinal,
		name:    formatUUID(info.uuid),
		model:   info.model,
		total:   info.total,
		reader:  &hostReader{ctx: ctx},
	}
	d.openCuFile()
	if err := d.setGeometry(opts.ChunkSize); err != nil {
		_ = d.Close()
		return nil, fmt.Errorf("cuda: device %d: %w", ordinal, err)
	}
	if warm := min(int64(opts.WarmChunks), d.total/32/d.chunkSize); warm > 0 {
		d.pool = newChunkPool(d.ctx, d.chunkSize, int(warm))
	}
	log.Info("cuda device open",
		zap.Int("ordinal", ordinal), zap.String("name", d.name), zap.String("model", d.model),
		zap.Int64("granularity", d.gran), zap.Int64("chunk_size", d.chunkSize),
		zap.String("cufile", d.cufileMode()), zap.Bool("rdma_allocations", d.ctx.rdmaOn()))
	return d, nil
}

// setGeometry reads the allocation granularity (for allocations made the
// way this device makes them) and rounds the chunk size to it.
func (d *Device) setGeometry(chunkSize int64) error {
	gran, err := d.ctx.granularity()
	if err != nil {
		return err
	}
	if gran <= 0 {
		return fmt.Errorf("cuMemGetAllocationGranularity: granularity %d", gran)
	}
	if chunkSize == 0 {
		chunkSize = DefaultChunkSize
	}
	d.gran, d.chunkSize = gran, gpu.RoundUp(chunkSize, gran)
	return nil
}

// formatUUID spells a device UUID the way nvidia-smi does.
func formatUUID(u [16]byte) string {
	return fmt.Sprintf("GPU-%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
}

// openCuFile opens the cuFile driver. In gds mode nvidia-fs DMAs into the
// allocations, so they are made GPUDirect RDMA capable where the device
// allows it for VMM memory.
func (d *Device) openCuFile() {
	mode, err := acquireCuFile(d.ctx)
	if err != nil {
		d.cufileReason = err.Error()
		d.log.Info("cufile unavailable", zap.String("reason", d.cufileReason))
		return
	}
	d.cufile = &cuFile{dev: d, mode: mode}
	if mode == "gds" {
		rdma := d.ctx.rdmaVMMSupported()
		d.ctx.setRDMA(rdma)
		if !rdma {
			d.log.Warn("nvidia-fs is loaded but the device cannot make VMM allocations GPUDirect RDMA capable")
		}
	}
}

func (d *Device) cufileMode() string {
	if d.cufile == nil {
		return "unavailable: " + d.cufileReason
	}
	return d.cufile.mode
}

// Kind is gpu.KindCUDA.
func (d *Device) Kind() string { return gpu.KindCUDA }

// Name is "GPU-<uuid>", as nvidia-smi -L prints it.
func (d *Device) Name() string { return d.name }

// Model is the product name the driver reports ("NVIDIA H200").
func (d *Device) Model() string { return d.model }

// Ordinal is the CUDA device ordinal.
func (d *Device) Ordinal() int { return d.ordinal }

// Granularity is the recommended VMM allocation granularity.
func (d *Device) Granularity() int64 { return d.gran }

// takeChunk returns a ready chunk of size bytes from the pool, if any.
func (d *Device) takeChunk(size int64) (uint64, bool) {
	if d.pool == nil || size != d.pool.size {
		return 0, false
	}
	return d.pool.take()
}

// putChunk gives a chunk of size bytes back to the pool; false: release it.
func (d *Device) putChunk(size int64, h uint64) bool {
	return d.pool != nil && size == d.pool.size && d.pool.put(h)
}

// WarmChunks reports the chunks ready in the pool and how many regions'
// chunks were taken ready so far.
func (d *Device) WarmChunks() (ready int, hits uint64) {
	if d.pool == nil {
		return 0, 0
	}
	return d.pool.stats()
}

// HeldDescriptors is 0: a VMM allocation holds no descriptor; Export makes
// them for the caller.
func (d *Device) HeldDescriptors(int64) int { return 0 }

// MemInfo reports free and total device memory.
func (d *Device) MemInfo() (free, total int64, err error) {
	if err := d.check(); err != nil {
		return 0, 0, err
	}
	free, total, err = d.ctx.memInfo()
	if err != nil {
		return 0, 0, fmt.Errorf("cuda: %w", err)
	}
	return free, total, nil
}

// CuFile returns the cuFile driver, or nil and why it is unavailable.
func (d *Device) CuFile() (gpu.CuFile, string) {
	if d.cufile == nil {
		return nil, d.cufileReason
	}
	return d.cufile, ""
}

func (d *Device) check() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return errClosed
	}
	return nil
}

// Copy copies src into dst on the device and waits for the copy. Both must
// be Regions of this device; dst must be at least as large as src.
func (d *Device) Copy(dst, src gpu.Region) error {
	dr, err := d.own(dst)
	if err != nil {
		return fmt.Errorf("cuda: copy: destination: %w", err)
	}
	sr, err := d.own(src)
	if err != nil {
		return fmt.Errorf("cuda: copy: source: %w", err)
	}
	if dr.size < sr.size {
		return fmt.Errorf("cuda: copy: destination holds %d bytes, source %d", dr.size, sr.size)
	}
	if dr == sr {
		return nil
	}
	unlock, err := rlockPair(dr, sr)
	if err != nil {
		return fmt.Errorf("cuda: copy: %w", err)
	}
	defer unlock()
	if err := d.ctx.copyDtoD(dr.base, sr.base, sr.size); err != nil {
		return fmt.Errorf("cuda: copy %d bytes: %w", sr.size, err)
	}
	return nil
}

// own returns r as a Region of this device.
func (d *Device) own(r gpu.Region) (*Region, error) {
	cr, ok := r.(*Region)
	if !ok || cr == nil {
		return nil, fmt.Errorf("region %T is not a cuda region", r)
	}
	if cr.dev != d {
		return nil, fmt.Errorf("region belongs to %s, not %s", cr.dev.name, d.name)
	}
	return cr, nil
}

// Close closes cuFile (when this is its last user), frees the read-back
// buffers and releases the primary context. Regions and Workers must be
// freed first. Closing twice is a no-op.
func (d *Device) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	d.mu.Unlock()
	var errs []error
	errs = append(errs, d.reader.close())
	if d.pool != nil {
		errs = append(errs, d.pool.close())
	}
	if d.cufile != nil {
		errs = append(errs, releaseCuFile(d.ctx))
	}
	errs = append(errs, d.ctx.release())
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("cuda: close %s: %w", d.name, err)
	}
	d.log.Info("cuda device closed", zap.String("name", d.name))
	return nil
}
