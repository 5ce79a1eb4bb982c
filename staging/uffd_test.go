package staging

import (
	"os"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// blockedWrite is one pwrite of data at offset 0 whose source buffer has a
// hole: page hole is missing (userfaultfd), so the write stamps the file's
// mtime and ctime, copies what comes before the hole, and blocks inside
// the kernel until finish fills the hole. That is a write in progress,
// held still for as long as a test needs.
type blockedWrite struct {
	uffd int
	mem  []byte
	data []byte
	hole int // first missing page
	done chan error
}

const (
	uffdioAPI      = 0xC018AA3F // _IOWR(0xAA, 0x3F, struct uffdio_api)
	uffdioRegister = 0xC020AA00 // _IOWR(0xAA, 0x00, struct uffdio_register)
	uffdioCopy     = 0xC028AA03 // _IOWR(0xAA, 0x03, struct uffdio_copy)
)

func uffdIoctl(t *testing.T, fd int, req uintptr, arg unsafe.Pointer) {
	t.Helper()
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(arg)); e != 0 {
		t.Fatalf("userfaultfd ioctl %#x: %v", req, e)
	}
}

// startBlockedWrite starts the write and returns once it is blocked.
func startBlockedWrite(t *testing.T, path string, data []byte, hole int) *blockedWrite {
	t.Helper()
	page := os.Getpagesize()
	if len(data)%page != 0 || hole*page >= len(data) {
		t.Fatalf("blockedWrite: %d bytes, hole at page %d", len(data), hole)
	}
	fd, _, e := unix.Syscall(unix.SYS_USERFAULTFD, unix.O_CLOEXEC, 0, 0)
	if e != 0 {
		t.Fatalf("userfaultfd (the test runs as root): %v", e)
	}
	b := &blockedWrite{uffd: int(fd), data: data, hole: hole, done: make(chan error, 1)}
	api := [3]uint64{0xAA, 0, 0}
	uffdIoctl(t, b.uffd, uffdioAPI, unsafe.Pointer(&api))
	mem, err := unix.Mmap(-1, 0, len(data), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	b.mem = mem
	reg := [4]uint64{uint64(uintptr(unsafe.Pointer(&mem[0]))), uint64(len(mem)), 1 /* MISSING */, 0}
	uffdIoctl(t, b.uffd, uffdioRegister, unsafe.Pointer(&reg))
	b.fill(t, 0, hole)
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		_, err := unix.Pwrite(int(f.Fd()), mem, 0)
		f.Close()
		b.done <- err
	}()
	var msg [32]byte // struct uffd_msg: the fault on the hole
	if _, err := unix.Read(b.uffd, msg[:]); err != nil || msg[0] != 0x12 {
		t.Fatalf("waiting for the write to fault: %v, event %#x", err, msg[0])
	}
	t.Cleanup(func() { unix.Munmap(mem); unix.Close(b.uffd) })
	return b
}

// fill puts data's pages [from, to) into the buffer.
func (b *blockedWrite) fill(t *testing.T, from, to int) {
	t.Helper()
	page := os.Getpagesize()
	if from == to {
		return
	}
	cp := [5]uint64{
		uint64(uintptr(unsafe.Pointer(&b.mem[from*page]))),
		uint64(uintptr(unsafe.Pointer(&b.data[from*page]))),
		uint64((to - from) * page), 0, 0,
	}
	uffdIoctl(t, b.uffd, uffdioCopy, unsafe.Pointer(&cp))
}

// finish fills the hole and waits for the write to return.
func (b *blockedWrite) finish(t *testing.T) {
	t.Helper()
	b.fill(t, b.hole, len(b.data)/os.Getpagesize())
	if err := <-b.done; err != nil {
		t.Fatalf("the blocked write: %v", err)
	}
}
