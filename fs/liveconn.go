package fs

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"unsafe"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// go-fuse serves one /dev/fuse descriptor, read with blocking read(2) on
// its number, and has no way to stop reading it or to start on a
// connection already initialised. Both are done from outside, by
// replacing what the number names (dup3): while a hand-over is in
// progress, the old server's number names one end of a SOCK_SEQPACKET
// socket pair, from which nothing comes, and whatever it writes there
// (replies to requests it read before, notifications) is forwarded to
// the connection; a successor is started on a socket pair carrying a
// copy of the kernel's INIT, and its number then replaced by the
// connection. Readers blocked in read(2) on the old number are woken
// with a signal the Go runtime ignores (SIGURG, its preemption signal):
// the read restarts on what the number names now.

// fdMu serialises creating FUSE descriptors in this process, so that
// the one a mount made can be told from others (fuseFds).
var fdMu sync.Mutex

// fuseFds lists the descriptors of this process open on /dev/fuse.
func fuseFds() map[int]bool {
	fds := map[int]bool{}
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return fds
	}
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if t, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && t == "/dev/fuse" {
			fds[fd] = true
		}
	}
	return fds
}

// newFuseFd is the one descriptor in after that is not in before, or -1.
func newFuseFd(before, after map[int]bool) int {
	fd := -1
	for n := range after {
		if !before[n] {
			if fd >= 0 {
				return -1
			}
			fd = n
		}
	}
	return fd
}

// kickReaders interrupts every thread of the process with SIGURG: a
// blocking read(2) restarts (SA_RESTART) on what its descriptor number
// names now.
func kickReaders() error {
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return fmt.Errorf("listing threads: %w", err)
	}
	pid := unix.Getpid()
	for _, e := range ents {
		tid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if err := unix.Tgkill(pid, tid, unix.SIGURG); err != nil && err != unix.ESRCH {
			return fmt.Errorf("signalling thread %d: %w", tid, err)
		}
	}
	return nil
}

// maxMessage bounds one FUSE message: a reply of fuse.max_read bytes, or
// a request of max_write, and their headers.
const maxMessage = maxKernelRead + 64<<10

// seqpacket returns a SOCK_SEQPACKET pair whose sends take a whole FUSE
// message.
func seqpacket() ([2]int, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fds, fmt.Errorf("socketpair: %w", err)
	}
	for _, fd := range fds {
		if unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, 4*maxMessage) != nil {
			unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, 4*maxMessage)
		}
	}
	return fds, nil
}

// forward copies every message read from from to the FUSE connection to,
// until it reads an empty one or from fails; then it closes done.
func forward(from, to int, done chan<- struct{}) {
	defer close(done)
	buf := make([]byte, maxMessage)
	for {
		n, err := unix.Read(from, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil || n == 0 {
			return
		}
		// The kernel's answer to a late reply (ENOENT: the request was
		// interrupted) concerns nobody.
		unix.Write(to, buf[:n])
	}
}

// initRequest is a FUSE INIT request carrying the kernel's settings in.
func initRequest(in KernelInit) []byte {
	req := fuse.InitIn{Major: in.Major, Minor: in.Minor, MaxReadAhead: in.MaxReadAhead, Flags: in.Flags, Flags2: in.Flags2}
	size := int(unsafe.Sizeof(req))
	req.InHeader = fuse.InHeader{Length: uint32(size), Opcode: opInit, Unique: 1}
	return bytes.Clone(unsafe.Slice((*byte)(unsafe.Pointer(&req)), size))
}

// opInit is FUSE_INIT's opcode.
const opInit = 26

// initReply parses the reply to initRequest (a reply to an older kernel
// is shorter than InitOut: the rest stays zero).
func initReply(b []byte) (fuse.InitOut, error) {
	var h fuse.OutHeader
	var out fuse.InitOut
	hs := int(unsafe.Sizeof(h))
	if len(b) < hs {
		return out, fmt.Errorf("INIT reply of %d bytes", len(b))
	}
	copy(unsafe.Slice((*byte)(unsafe.Pointer(&h)), hs), b)
	if h.Status != 0 {
		return out, fmt.Errorf("INIT answered %v", unix.Errno(-h.Status))
	}
	copy(unsafe.Slice((*byte)(unsafe.Pointer(&out)), unsafe.Sizeof(out)), b[hs:])
	return out, nil
}

// unmountAdopted unmounts a mount this process did not make (go-fuse
// refuses to unmount a /dev/fd/N mount): directly as root, else through
// fusermount.
func unmountAdopted(mnt string) error {
	err := unix.Unmount(mnt, 0)
	if err == nil || !errors.Is(err, unix.EPERM) {
		if err != nil {
			return fmt.Errorf("unmount %s: %w", mnt, err)
		}
		return nil
	}
	for _, bin := range []string{"fusermount3", "fusermount"} {
		if out, err := exec.Command(bin, "-u", mnt).CombinedOutput(); err == nil {
			return nil
		} else if !errors.Is(err, exec.ErrNotFound) {
			return fmt.Errorf("%s -u %s: %v: %s", bin, mnt, err, bytes.TrimSpace(out))
		}
	}
	return fmt.Errorf("unmount %s: %w (and no fusermount)", mnt, err)
}
