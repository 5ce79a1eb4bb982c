package loader

import (
	"fmt"

	"github.com/gdsfs/gdsfs/gpu"
	"github.com/gdsfs/gdsfs/internal/units"
)

// PeerAccess asks both devices whether they copy between each other; when
// not, it says why.
func PeerAccess(a, b gpu.Device) (bool, string) {
	pa, ok1 := a.(gpu.Peer)
	pb, ok2 := b.(gpu.Peer)
	if !ok1 || !ok2 {
		return false, "the device cannot copy to another device"
	}
	if ok, why := pa.PeerAccess(b); !ok {
		return false, why
	}
	return pb.PeerAccess(a)
}

// CopyPeer copies sp of a file from region src (on device from) into dst
// (on device to), device to device.
func CopyPeer(to gpu.Device, dst gpu.Region, from gpu.Device, src gpu.Region, sp Span) error {
	p, ok := to.(gpu.Peer)
	if !ok {
		return fmt.Errorf("%s cannot copy from another device", to.Name())
	}
	if err := p.CopyRange(dst, sp.Off, src, sp.Off, sp.End-sp.Off); err != nil {
		return fmt.Errorf("copy %s from %s: %w", units.HumanBytes(sp.End-sp.Off), from.Name(), err)
	}
	return nil
}

// Shares splits size bytes into n contiguous shares of whole tasks of
// task bytes, one per device of a split ingest.
func Shares(size, task int64, n int) []Span {
	tasks := (size + task - 1) / task
	out := make([]Span, n)
	for i := range out {
		out[i] = Span{min(size, tasks*int64(i)/int64(n)*task), min(size, tasks*int64(i+1)/int64(n)*task)}
	}
	return out
}
