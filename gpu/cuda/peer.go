package cuda

import (
	"fmt"

	"go.uber.org/zap"

	"github.com/gdsfs/gdsfs/gpu"
)

var _ gpu.Peer = (*Device)(nil)

// Peer copies: a replica of a file on another GPU of this process is
// filled device to device. The pair's peer access is checked and enabled
// once (cuDeviceCanAccessPeer both ways, cuCtxEnablePeerAccess both
// ways); a VMM allocation is reachable from another device only once
// cuMemSetAccess grants it that device, so each region grants the peer
// it is copied with, once. The copy itself is cuMemcpyPeerAsync on a
// stream of the destination's context, over NVLink or PCIe, whichever
// joins the pair. With the source and destination on one device it is
// the same call (a device-to-device copy): the GPU tier runs it on any
// GPU machine.

// PeerAccess says whether d and other can copy between their regions
// directly, enabling it the first time. other must be a CUDA device of
// this process.
func (d *Device) PeerAccess(other gpu.Device) (bool, string) {
	o, ok := other.(*Device)
	switch {
	case !ok:
		return false, fmt.Sprintf("%s is not a CUDA device", other.Name())
	case o == d:
		return true, ""
	}
	d.peerMu.Lock()
	defer d.peerMu.Unlock()
	if why, done := d.peers[o]; done {
		return why == "", why
	}
	why := enablePair(d, o)
	if d.peers == nil {
		d.peers = map[*Device]string{}
	}
	d.peers[o] = why
	if why == "" {
		d.log.Info("peer access enabled", zap.String("device", d.name), zap.String("peer", o.name))
	} else {
		d.log.Info("no peer access", zap.String("device", d.name), zap.String("peer", o.name), zap.String("why", why))
	}
	return why == "", why
}

// enablePair checks that a and b reach each other's memory and enables
// it both ways; "" on success, else why not.
func enablePair(a, b *Device) string {
	for _, p := range [][2]*Device{{a, b}, {b, a}} {
		can, err := canAccessPeer(p[0].ctx, p[1].ctx)
		switch {
		case err != nil:
			return err.Error()
		case !can:
			return fmt.Sprintf("cuDeviceCanAccessPeer: device %d cannot reach device %d (no NVLink or PCIe peer-to-peer between them)", p[0].ordinal, p[1].ordinal)
		}
		if err := p[0].ctx.enablePeer(p[1].ctx); err != nil {
			return err.Error()
		}
	}
	return ""
}

// CopyRange copies n bytes at srcOff of src (a region of d or of a
// device PeerAccess allowed) to dstOff of dst (a region of d) and waits.
func (d *Device) CopyRange(dst gpu.Region, dstOff int64, src gpu.Region, srcOff, n int64) error {
	dr, err := d.own(dst)
	if err != nil {
		return fmt.Errorf("cuda: peer copy: destination: %w", err)
	}
	sr, ok := src.(*Region)
	if !ok || sr == nil {
		return fmt.Errorf("cuda: peer copy: source %T is not a cuda region", src)
	}
	switch {
	case n < 0 || srcOff < 0 || dstOff < 0 || srcOff+n > sr.size || dstOff+n > dr.total:
		return fmt.Errorf("cuda: peer copy of %d bytes from %d to %d: outside the regions (%d and %d bytes)", n, srcOff, dstOff, sr.size, dr.total)
	case n == 0:
		return nil
	}
	if sr.dev != d {
		if ok, why := d.PeerAccess(sr.dev); !ok {
			return fmt.Errorf("cuda: peer copy from %s to %s: %s", sr.dev.name, d.name, why)
		}
	}
	unlock, err := rlockRegions(dr, sr)
	if err != nil {
		return fmt.Errorf("cuda: peer copy: %w", err)
	}
	defer unlock()
	if sr.dev != d {
		if err := sr.grant(d); err != nil {
			return fmt.Errorf("cuda: peer copy: %w", err)
		}
		if err := dr.grant(sr.dev); err != nil {
			return fmt.Errorf("cuda: peer copy: %w", err)
		}
	}
	if err := copyPeer(d.ctx, dr.base+uint64(dstOff), sr.dev.ctx, sr.base+uint64(srcOff), n); err != nil {
		return fmt.Errorf("cuda: peer copy of %d bytes from %s to %s: %w", n, sr.dev.name, d.name, err)
	}
	return nil
}

// rlockRegions read-locks a and b (once when they are one region).
func rlockRegions(a, b *Region) (unlock func(), err error) {
	if a != b {
		return rlockPair(a, b)
	}
	if err := a.rlock(); err != nil {
		return nil, err
	}
	return a.mu.RUnlock, nil
}

// grant lets peer's device reach r (cuMemSetAccess over the whole
// mapping), once. r.mu must be held shared.
func (r *Region) grant(peer *Device) error {
	r.accessMu.Lock()
	defer r.accessMu.Unlock()
	if r.access[peer] {
		return nil
	}
	if err := r.dev.ctx.setAccessFor(peer.ctx, r.base, r.total); err != nil {
		return fmt.Errorf("grant %s access to a region of %s: %w", peer.name, r.dev.name, err)
	}
	if r.access == nil {
		r.access = map[*Device]bool{}
	}
	r.access[peer] = true
	return nil
}
