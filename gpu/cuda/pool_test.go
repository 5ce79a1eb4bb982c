package cuda

import (
	"bytes"
	"testing"

	"github.com/gdsfs/gdsfs/gpu"
)

// TestWarmChunks: with gpu.Options.WarmChunks, chunks are allocated ahead
// and handed to new regions ready; whatever a region's chunks held before
// (another file's bytes, when a chunk comes back from a freed region), a
// new region shows zeros past the file's end.
func TestWarmChunks(t *testing.T) {
	d, g := smallChunks(t)
	d.Close()
	d = openWith(t, gpu.Options{ChunkSize: 2 * g, WarmChunks: 2})
	if ready, _ := d.WarmChunks(); ready != 2 {
		t.Fatalf("%d chunks ready after Open, want 2", ready)
	}
	size := 4*g - 100 // two chunks, the last one full-size: pooled
	junk := bytes.Repeat([]byte{0xAB}, int(4*g))
	for i := range 4 {
		r, err := d.Alloc(size)
		if err != nil {
			t.Fatal(err)
		}
		reg := r.(*Region)
		tail := make([]byte, reg.total-reg.size)
		if err := d.reader.read(tail, reg.base+uint64(reg.size)); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(tail, make([]byte, len(tail))) {
			t.Fatalf("round %d: the %d bytes past the end are not zero", i, len(tail))
		}
		fill(t, d, r, junk[:size], int(g)) // what the next region must not show
		if err := d.copyJunkTail(reg); err != nil {
			t.Fatal(err)
		}
		if err := r.Free(); err != nil {
			t.Fatal(err)
		}
	}
	if _, hits := d.WarmChunks(); hits == 0 {
		t.Fatal("no region took a ready chunk")
	}
}

// copyJunkTail writes 0xAB past r's end too, so a recycled chunk would
// carry it.
func (d *Device) copyJunkTail(r *Region) error {
	n := r.total - r.size
	src, err := d.Alloc(n)
	if err != nil {
		return err
	}
	defer src.Free()
	s := src.(*Region)
	if err := d.ctx.memsetZero(s.base, s.total); err != nil {
		return err
	}
	w, err := d.NewWorker(int(n))
	if err != nil {
		return err
	}
	defer w.Close()
	copy(w.Buffer(0), bytes.Repeat([]byte{0xAB}, int(n)))
	if err := w.CopyAsync(src, 0, 0, int(n)); err != nil {
		return err
	}
	if err := w.Wait(0); err != nil {
		return err
	}
	return d.ctx.copyDtoD(r.base+uint64(r.size), s.base, n)
}
