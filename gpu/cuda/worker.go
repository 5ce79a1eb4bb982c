package cuda

import (
	"errors"
	"fmt"

	"github.com/gdsfs/gdsfs/gpu"
)

var _ gpu.Worker = (*Worker)(nil)

// Worker copies host bytes into Regions through two pinned bounce buffers
// (cuMemHostAlloc) on its own non-blocking stream, with one event per
// buffer. It is used by one goroutine at a time.
type Worker struct {
	dev    *Device
	pipe   *pipe
	size   int
	errs   [2]error // error of the last CopyAsync from each buffer
	closed bool
}

// NewWorker returns a Worker with two pinned buffers of bufSize bytes.
func (d *Device) NewWorker(bufSize int) (gpu.Worker, error) {
	if bufSize <= 0 {
		return nil, fmt.Errorf("cuda: worker buffer size %d must be positive", bufSize)
	}
	if err := d.check(); err != nil {
		return nil, err
	}
	p, err := d.ctx.newPipe(bufSize)
	if err != nil {
		return nil, fmt.Errorf("cuda: new worker with 2 x %d byte buffers: %w", bufSize, err)
	}
	return &Worker{dev: d, pipe: p, size: bufSize}, nil
}

// Buffer returns pinned buffer i (0 or 1), or nil for any other i or after
// Close. The slice points at C memory that Close frees.
func (w *Worker) Buffer(i int) []byte {
	if w.closed || (i != 0 && i != 1) {
		return nil
	}
	return w.pipe.buffer(i)
}

// CopyAsync starts copying Buffer(i)[:n] to dst at off and records event i.
// dst must be a Region of this worker's device and [off, off+n) must lie in
// it.
func (w *Worker) CopyAsync(dst gpu.Region, off int64, i, n int) error {
	if w.closed {
		return errClosed
	}
	if i != 0 && i != 1 {
		return fmt.Errorf("cuda: copy: buffer index %d is not 0 or 1", i)
	}
	if n < 0 || n > w.size {
		return fmt.Errorf("cuda: copy: %d bytes do not fit a %d byte buffer", n, w.size)
	}
	r, err := w.dev.own(dst)
	if err != nil {
		return fmt.Errorf("cuda: copy: %w", err)
	}
	if off < 0 || off > r.size-int64(n) {
		return fmt.Errorf("cuda: copy: %d bytes at %d fall outside a %d byte region", n, off, r.size)
	}
	if err := r.rlock(); err != nil {
		return fmt.Errorf("cuda: copy: %w", err)
	}
	defer r.mu.RUnlock()
	w.errs[i] = nil
	if n == 0 {
		return nil
	}
	if err := w.pipe.htod(i, r.base+uint64(off), n); err != nil {
		w.errs[i] = fmt.Errorf("cuda: copy %d bytes to %d: %w", n, off, err)
		return w.errs[i]
	}
	return nil
}

// Wait blocks until the last copy from Buffer(i) completed and returns its
// error (a failure to start it, or one the stream reported).
func (w *Worker) Wait(i int) error {
	if w.closed {
		return errClosed
	}
	if i != 0 && i != 1 {
		return fmt.Errorf("cuda: wait: buffer index %d is not 0 or 1", i)
	}
	err := w.pipe.wait(i)
	if prev := w.errs[i]; prev != nil {
		w.errs[i] = nil
		return prev
	}
	if err != nil {
		return fmt.Errorf("cuda: wait for copy from buffer %d: %w", i, err)
	}
	return nil
}

// Close waits for pending copies and frees the buffers, events and stream.
func (w *Worker) Close() error {
	if w.closed {
		return nil
	}
	err := errors.Join(w.Wait(0), w.Wait(1))
	w.closed = true
	if ferr := w.pipe.free(); ferr != nil {
		err = errors.Join(err, fmt.Errorf("cuda: free worker: %w", ferr))
	}
	return err
}
