package client

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/internal/mountinfo"
	"github.com/gdsfs/gdsfs/ipc"
)

// Error is a failure the daemon answered; errors.Is(err, syscall.EACCES)
// works on it.
type Error struct {
	Errno syscall.Errno
	Msg   string
}

func (e *Error) Error() string { return e.Msg }

// Unwrap makes the errno visible to errors.Is.
func (e *Error) Unwrap() error { return e.Errno }

// Conn is one connection to a daemon's lease socket. Its methods are safe
// for concurrent use; requests on one Conn are answered in turn.
type Conn struct {
	mu    sync.Mutex // serialises request/answer pairs
	c     *net.UnixConn
	epoch uint64      // of the last answer
	dead  atomic.Bool // a request failed without an answer
}

// broken reports whether a request on c failed without an answer.
func (c *Conn) broken() bool { return c.dead.Load() }

// Dial connects to a lease socket.
func Dial(socket string) (*Conn, error) {
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: socket, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("gdsfs socket %s: %w", socket, err)
	}
	return &Conn{c: c}, nil
}

// Close closes the connection; the daemon ends every lease it held.
func (c *Conn) Close() error { return c.c.Close() }

// Locate finds the gdsfs mount holding path and returns the lease socket
// and path relative to the mount. GDSFS_SOCKET overrides the socket (the
// path is then sent absolute).
func Locate(path string) (socket, rel string, err error) {
	if s := os.Getenv("GDSFS_SOCKET"); s != "" {
		abs, err := filepath.Abs(path)
		return s, abs, err
	}
	mnt, rel, err := mountinfo.Root(path)
	if err != nil {
		return "", "", err
	}
	b, err := os.ReadFile(filepath.Join(mnt, ".gdsfs", "socket"))
	if err != nil {
		return "", "", fmt.Errorf("%s: gdsfs mount %s has no readable .gdsfs/socket: %w", path, mnt, err)
	}
	return strings.TrimSpace(string(b)), rel, nil
}

// roundTrip sends one request and reads its answer line and descriptors.
func (c *Conn) roundTrip(req ipc.Request) (ipc.Response, []*os.File, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	b, _ := json.Marshal(req)
	if _, err := c.c.Write(append(b, '\n')); err != nil {
		c.dead.Store(true)
		return ipc.Response{}, nil, fmt.Errorf("gdsfs %s: %w", req.Op, err)
	}
	var line []byte
	var files []*os.File
	buf := make([]byte, 64<<10)
	oob := make([]byte, unix.CmsgSpace(253*4))
	for !bytes.Contains(line, []byte{'\n'}) {
		n, oobn, _, _, err := c.c.ReadMsgUnix(buf, oob)
		if oobn > 0 {
			fs, perr := parseRights(oob[:oobn])
			files = append(files, fs...)
			if perr != nil {
				closeAll(files)
				return ipc.Response{}, nil, perr
			}
		}
		line = append(line, buf[:n]...)
		if err != nil || n == 0 {
			closeAll(files)
			c.dead.Store(true)
			return ipc.Response{}, nil, fmt.Errorf("gdsfs %s: connection closed by the daemon: %v", req.Op, err)
		}
	}
	var resp ipc.Response
	if err := json.Unmarshal(line, &resp); err != nil {
		closeAll(files)
		return ipc.Response{}, nil, fmt.Errorf("gdsfs %s: bad answer: %w", req.Op, err)
	}
	c.epoch = resp.Epoch
	if !resp.OK {
		closeAll(files)
		return resp, nil, &Error{Errno: errnoByName(resp.Errno), Msg: resp.Error}
	}
	return resp, files, nil
}

func parseRights(oob []byte) ([]*os.File, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, fmt.Errorf("control message: %w", err)
	}
	var files []*os.File
	for _, m := range msgs {
		fds, err := unix.ParseUnixRights(&m)
		if err != nil {
			continue
		}
		for _, fd := range fds {
			unix.CloseOnExec(fd)
			files = append(files, os.NewFile(uintptr(fd), "gdsfs-chunk"))
		}
	}
	return files, nil
}

func closeAll(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}

// errnoByName maps "EACCES" back to the errno (EIO when unknown).
func errnoByName(name string) syscall.Errno {
	for e := syscall.Errno(1); e < 200; e++ {
		if unix.ErrnoName(e) == name {
			return e
		}
	}
	return syscall.EIO
}

// Stat asks the state of a file without staging it.
func (c *Conn) Stat(path string) (ipc.Response, error) {
	resp, _, err := c.roundTrip(ipc.Request{Op: ipc.OpStat, Path: path})
	return resp, err
}
