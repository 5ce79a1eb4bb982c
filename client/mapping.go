package client

import (
	"fmt"
	"io"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/proto"
)

// mapping is a consumer's view of a grant's chunks: host or CUDA.
type mapping interface {
	Ptr() uint64
	ReadAt(p []byte, off int64) (int, error)
	ReadOnly() bool
	Close() error
}

// mapGrant maps the chunks of g (files, in order): read-only unless the
// grant is private.
func mapGrant(g *proto.Grant, files []*os.File) (mapping, error) {
	lens := g.ChunkLens()
	if len(files) == 0 || len(files) != len(lens) {
		return nil, &Error{Code: proto.EPROTO, Msg: fmt.Sprintf("%d descriptors for %d chunks", len(files), len(lens))}
	}
	var total int64
	for _, n := range lens {
		total += n
	}
	if g.Size < 0 || g.Size > total {
		return nil, &Error{Code: proto.EPROTO, Msg: fmt.Sprintf("size %d outside chunks of %d bytes", g.Size, total)}
	}
	writable := g.Sharing == proto.SharingPrivate
	if proto.IsHost(g.Device) {
		return mapHost(files, lens, g.Size, writable)
	}
	return mapCUDA(g.Device, files, lens, g.Size, writable)
}

// hostMapping is memfd chunks mapped back to back. Shared grants are
// mapped PROT_READ over MAP_SHARED (the daemon sealed the memfds against
// writes, so no process can map them writable); private grants are
// MAP_PRIVATE and writable, copy-on-write in this process only.
type hostMapping struct {
	mem      []byte // the whole reserved range
	size     int64
	writable bool
}

func mapHost(files []*os.File, lens []int64, size int64, writable bool) (*hostMapping, error) {
	var total int64
	for _, n := range lens {
		total += n
	}
	mem, err := unix.Mmap(-1, 0, int(total), unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		return nil, fmt.Errorf("reserve %d bytes: %w", total, err)
	}
	prot, flags := unix.PROT_READ, unix.MAP_SHARED
	if writable {
		prot, flags = unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE
	}
	var off int64
	for i, f := range files {
		var st unix.Stat_t
		if err := unix.Fstat(int(f.Fd()), &st); err != nil || st.Size < lens[i] {
			unix.Munmap(mem)
			return nil, fmt.Errorf("chunk %d: descriptor holds %d bytes, want %d (%v)", i, st.Size, lens[i], err)
		}
		addr := uintptr(unsafe.Pointer(&mem[off]))
		_, _, errno := unix.Syscall6(unix.SYS_MMAP, addr, uintptr(lens[i]), uintptr(prot), uintptr(flags|unix.MAP_FIXED), f.Fd(), 0)
		if errno != 0 {
			unix.Munmap(mem)
			return nil, fmt.Errorf("map chunk %d: %w", i, errno)
		}
		off += lens[i]
	}
	return &hostMapping{mem: mem, size: size, writable: writable}, nil
}

func (m *hostMapping) Ptr() uint64 { return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(m.mem)))) }

func (m *hostMapping) ReadOnly() bool { return !m.writable }

func (m *hostMapping) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 || off > m.size {
		return 0, fmt.Errorf("read at %d: outside %d bytes", off, m.size)
	}
	n := copy(p, m.mem[off:m.size])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

func (m *hostMapping) Close() error {
	if m.mem == nil {
		return nil
	}
	err := unix.Munmap(m.mem)
	m.mem = nil
	return err
}
