package fs

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"
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
// connection. Readers blocked in read(2) on the number are woken with a
// signal the Go runtime ignores when it did not ask for it (SIGURG, its
// preemption signal): the read restarts on what the number names now.

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

// kickReaders interrupts, with SIGURG, the threads that may be in
// read(2) on descriptor fd: the read restarts (SA_RESTART) on what fd
// names now. Those are the threads blocked in read(2) on fd and those
// not blocked at all (one may be on its way into the wait, holding what
// fd named before). Threads blocked elsewhere (the GPU driver's among
// them) are left alone. One round misses a thread now and then (seen
// about once in a few hundred switches), so it kicks twice, then, where
// the kernel names the function a thread sleeps in (wchan), until no
// thread sleeps in stale (the old file's wait; "" to skip), for at most
// about 50ms.
func kickReaders(fd int, stale string) error {
	for round := 0; ; round++ {
		n, err := kickOnce(fd, stale, round >= 2)
		if err != nil || round >= 1 && n == 0 || round == 50 {
			return err
		}
		time.Sleep(time.Millisecond)
	}
}

// kickOnce signals the threads that may be reading fd (or, when only is
// set, those sleeping in stale on it) and returns how many sleep in
// stale.
func kickOnce(fd int, stale string, only bool) (int, error) {
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return 0, fmt.Errorf("listing threads: %w", err)
	}
	pid, stuck := unix.Getpid(), 0
	for _, e := range ents {
		tid, err := strconv.Atoi(e.Name())
		if err != nil || !readingFd(tid, fd) {
			continue
		}
		on := stale != "" && sleepsIn(tid, stale)
		if on {
			stuck++
		}
		if only && !on {
			continue
		}
		if err := unix.Tgkill(pid, tid, unix.SIGURG); err != nil && err != unix.ESRCH {
			return 0, fmt.Errorf("signalling thread %d: %w", tid, err)
		}
	}
	return stuck, nil
}

// socketWait is where a read(2) of an empty socket sleeps (Linux 6).
const socketWait = "__skb_wait_for_more_packets"

// sleepsIn reports whether thread tid sleeps in the kernel function fn.
func sleepsIn(tid int, fn string) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/self/task/%d/wchan", tid))
	return err == nil && strings.TrimSpace(string(b)) == fn
}

// readingFd reports whether thread tid is blocked in read(2) on fd or
// not blocked (/proc/self/task/TID/syscall: the call's number and
// arguments, or "running").
func readingFd(tid, fd int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/self/task/%d/syscall", tid))
	if err != nil {
		return true // cannot tell: a spurious SIGURG is harmless
	}
	f := strings.Fields(string(b))
	if len(f) == 1 && f[0] == "running" {
		return true
	}
	if len(f) < 2 || f[0] != strconv.Itoa(unix.SYS_READ) {
		return false
	}
	arg, err := strconv.ParseUint(strings.TrimPrefix(f[1], "0x"), 16, 64)
	return err == nil && arg == uint64(fd)
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

// rawBytes is the memory of *v, as the FUSE protocol lays it out.
func rawBytes[T any](v *T) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(v)), unsafe.Sizeof(*v))
}

// notification is the FUSE notification code (NOTIFY_*) with body, the
// parts written back to back after the header.
func notification(code int32, body ...[]byte) []byte {
	h := fuse.OutHeader{Status: code}
	b := bytes.Join(append([][]byte{rawBytes(&h)}, body...), nil)
	h.Length = uint32(len(b))
	copy(b, rawBytes(&h))
	return b
}

// initRequest is a FUSE INIT request carrying the kernel's settings in.
func initRequest(in KernelInit) []byte {
	req := fuse.InitIn{Major: in.Major, Minor: in.Minor, MaxReadAhead: in.MaxReadAhead, Flags: in.Flags, Flags2: in.Flags2}
	req.InHeader = fuse.InHeader{Length: uint32(unsafe.Sizeof(req)), Opcode: opInit, Unique: 1}
	return bytes.Clone(rawBytes(&req))
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
	copy(rawBytes(&h), b)
	if h.Status != 0 {
		return out, fmt.Errorf("INIT answered %v", unix.Errno(-h.Status))
	}
	copy(rawBytes(&out), b[hs:])
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
