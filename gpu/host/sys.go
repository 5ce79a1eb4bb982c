package host

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/gpu"
)

// newChunk creates a sealable memfd of n bytes.
func newChunk(name string, n int64) (*os.File, error) {
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("memfd_create: %w", err)
	}
	f := os.NewFile(uintptr(fd), "memfd:"+name)
	if err := unix.Ftruncate(fd, n); err != nil {
		f.Close()
		return nil, fmt.Errorf("ftruncate memfd to %d: %w", n, err)
	}
	return f, nil
}

// mapFixed maps f over the address range of dst (which must be a part of an
// existing mapping) with prot, MAP_SHARED.
func mapFixed(dst []byte, f *os.File, prot int) error {
	addr := uintptr(unsafe.Pointer(unsafe.SliceData(dst)))
	_, _, errno := unix.Syscall6(unix.SYS_MMAP, addr, uintptr(len(dst)), uintptr(prot),
		uintptr(unix.MAP_SHARED|unix.MAP_FIXED), f.Fd(), 0)
	if errno != 0 {
		return fmt.Errorf("mmap %s: %w", f.Name(), errno)
	}
	return nil
}

func mapErr(err error) error {
	if errors.Is(err, unix.ENOMEM) || errors.Is(err, unix.ENOSPC) {
		return fmt.Errorf("%w: %v", gpu.ErrOutOfMemory, err)
	}
	return err
}

func memInfo() (free, total int64, err error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, 0, fmt.Errorf("meminfo: %w", err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) < 2 {
			continue
		}
		v, perr := strconv.ParseInt(fields[1], 10, 64)
		if perr != nil {
			continue
		}
		switch fields[0] {
		case "MemTotal:":
			total = v << 10
		case "MemAvailable:":
			free = v << 10
		}
	}
	if total == 0 {
		return 0, 0, fmt.Errorf("meminfo: no MemTotal line")
	}
	return free, total, s.Err()
}

// Mapping is a consumer's read-only view of exported chunks.
type Mapping struct {
	mem  []byte
	size int64
}

// Map maps exported memfds read-only and contiguously. It does not close the
// files. size is the file size (the chunks may hold more).
func Map(files []*os.File, lens []int64, size int64) (*Mapping, error) {
	if len(files) != len(lens) || len(files) == 0 {
		return nil, fmt.Errorf("map: %d descriptors for %d chunks", len(files), len(lens))
	}
	var total int64
	for _, l := range lens {
		if l <= 0 {
			return nil, fmt.Errorf("map: chunk length %d", l)
		}
		total += l
	}
	if size < 0 || size > total {
		return nil, fmt.Errorf("map: size %d outside chunks of %d bytes", size, total)
	}
	base, err := unix.Mmap(-1, 0, int(total), unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		return nil, fmt.Errorf("map: reserve %d bytes: %w", total, err)
	}
	var off int64
	for i, f := range files {
		var st unix.Stat_t
		if err := unix.Fstat(int(f.Fd()), &st); err != nil || st.Size < lens[i] {
			unix.Munmap(base)
			return nil, fmt.Errorf("map: chunk %d: descriptor holds %d bytes, want %d (%v)", i, st.Size, lens[i], err)
		}
		if err := mapFixed(base[off:off+lens[i]], f, unix.PROT_READ); err != nil {
			unix.Munmap(base)
			return nil, fmt.Errorf("map: chunk %d: %w", i, err)
		}
		off += lens[i]
	}
	return &Mapping{mem: base, size: size}, nil
}

// Bytes returns the mapped file bytes; valid until Close.
func (m *Mapping) Bytes() []byte { return m.mem[:m.size] }

// Size is the file size.
func (m *Mapping) Size() int64 { return m.size }

// Ptr is the address of the mapping in this process.
func (m *Mapping) Ptr() uint64 { return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(m.mem)))) }

// ReadAt copies mapped bytes to p.
func (m *Mapping) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 || off > m.size {
		return 0, fmt.Errorf("read at %d: outside %d bytes", off, m.size)
	}
	n := copy(p, m.mem[off:m.size])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// Close unmaps; calling it twice is harmless.
func (m *Mapping) Close() error {
	if m.mem == nil {
		return nil
	}
	err := unix.Munmap(m.mem)
	m.mem = nil
	return err
}
