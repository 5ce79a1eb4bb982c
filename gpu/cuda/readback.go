package cuda

import "sync"

const (
	// directReadMax is the largest read copied straight into Go memory;
	// larger reads go through pinned buffers.
	directReadMax = 1 << 20
	// stageSize is the size of each pinned read-back buffer.
	stageSize = 8 << 20
)

// hostReader copies device bytes to host memory for one context. Large
// reads go through two pinned buffers in turn, so the device-to-host copy
// of one piece overlaps the host copy of the last: verifying a 4 GiB file
// runs at memory speed, not at pageable-copy speed.
type hostReader struct {
	ctx *cuContext

	mu   sync.Mutex // serialises large reads; guards pipe
	pipe *pipe      // created on the first large read
}

// read copies len(dst) device bytes at src into dst.
func (h *hostReader) read(dst []byte, src uint64) error {
	if len(dst) <= directReadMax {
		return h.ctx.copyDtoH(dst, src)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.pipe == nil {
		p, err := h.ctx.newPipe(stageSize)
		if err != nil {
			// No pinned memory to spare: the pageable path is slower
			// but still correct.
			return h.ctx.copyDtoH(dst, src)
		}
		h.pipe = p
	}
	return h.pipe.dtoh(dst, src)
}

func (h *hostReader) close() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.pipe == nil {
		return nil
	}
	err := h.pipe.free()
	h.pipe = nil
	return err
}
