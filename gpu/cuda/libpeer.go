//go:build cgo

package cuda

/*
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"errors"
	"unsafe"
)

// The cgo side of peer copies and the topology report (peer.go and
// topology.go hold the logic): a third file that imports "C", beside
// lib.go and libcufile.go.

// devContext is info's device without a context: enough for the
// queries below that take a device.
func devContext(info deviceInfo) *cuContext { return &cuContext{dev: info.dev} }

// canAccessPeer is cuDeviceCanAccessPeer(a, b): whether a can reach b's
// memory directly.
func canAccessPeer(a, b *cuContext) (bool, error) {
	var v C.int
	err := cuErr("cuDeviceCanAccessPeer", C.gds_can_access_peer(a.dev, b.dev, &v))
	return v != 0, err
}

// p2pRank is cuDeviceGetP2PAttribute(PERFORMANCE_RANK) of the link from
// a to b (distinct devices).
func p2pRank(a, b *cuContext) (int, error) {
	var v C.int
	err := cuErr("cuDeviceGetP2PAttribute", C.gds_p2p_attr(a.dev, b.dev, C.GDS_CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK, &v))
	return int(v), err
}

// enablePeer lets c's device reach peer's allocations (cuCtxEnablePeerAccess).
func (c *cuContext) enablePeer(peer *cuContext) error {
	return cuErr("cuCtxEnablePeerAccess", C.gds_enable_peer(c.ctx, peer.ctx))
}

// setAccessFor grants peer's device read-write access to [ptr, ptr+size)
// of c's mapping.
func (c *cuContext) setAccessFor(peer *cuContext, ptr uint64, size int64) error {
	return cuErr("cuMemSetAccess", C.gds_mem_set_access(c.ctx, peer.dev, C.CUdeviceptr(ptr), C.size_t(size)))
}

// copyPeer copies n bytes from src (on sctx's device) to dst (on dctx's)
// with cuMemcpyPeerAsync on a stream of dctx, and waits.
func copyPeer(dctx *cuContext, dst uint64, sctx *cuContext, src uint64, n int64) error {
	return cuErr("cuMemcpyPeerAsync", C.gds_copy_peer(dctx.ctx, C.CUdeviceptr(dst), sctx.ctx, C.CUdeviceptr(src), C.size_t(n)))
}

// nvmlLinks counts the NVLinks between the GPUs named a and b (see
// gds_nvml_links).
func nvmlLinks(a, b string) (nvlinks, error) {
	ca, cb := C.CString(a), C.CString(b)
	defer C.free(unsafe.Pointer(ca))
	defer C.free(unsafe.Pointer(cb))
	var direct, swA, swB, p2p C.int
	var buf [256]C.char
	if C.gds_nvml_links(ca, cb, &direct, &swA, &swB, &p2p, &buf[0], C.size_t(len(buf))) != 0 {
		return nvlinks{}, errors.New(C.GoString(&buf[0]))
	}
	return nvlinks{direct: int(direct), switchA: int(swA), switchB: int(swB), p2p: p2p != 0}, nil
}
