package bench

// Waiting on the daemons the bench starts, by the events they give:
// READY=1 on $NOTIFY_SOCKET once gdsfs serves its mount and lease socket;
// the mount table's change notification for a daemon that says nothing
// (go-fuse's loopback example); the lease socket's wait (a file reaching a
// state) and wait_stat (a lease counter reaching a value). Nothing here
// polls on a timer.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/client"
	"github.com/gdsfs/gdsfs/internal/mountinfo"
	"github.com/gdsfs/gdsfs/proto"
)

// readiness says how to know that a started daemon serves its mount.
type readiness struct {
	notify bool   // it says READY=1 on $NOTIFY_SOCKET (gdsfs)
	fstype string // otherwise: the mount table lists the mountpoint with this type
}

// notifyListener listens where a service manager would ($NOTIFY_SOCKET,
// sd_notify(3)). It reads until closed: gdsfs also says STOPPING=1 when
// it stops.
type notifyListener struct {
	dir   string
	l     *net.UnixConn
	ready chan int // the MAINPID of the first READY=1
}

func listenNotify() (*notifyListener, error) {
	dir, err := os.MkdirTemp("", "gdsfs-notify-") // short: a socket path is at most 107 bytes
	if err != nil {
		return nil, fmt.Errorf("notification socket: %w", err)
	}
	path := filepath.Join(dir, "notify")
	l, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("notification socket: %w", err)
	}
	n := &notifyListener{dir: dir, l: l, ready: make(chan int, 1)}
	go n.read()
	return n, nil
}

func (n *notifyListener) path() string { return filepath.Join(n.dir, "notify") }

func (n *notifyListener) read() {
	buf := make([]byte, 4096)
	for {
		m, err := n.l.Read(buf) // ends when the listener is closed
		if err != nil {
			return
		}
		fields := strings.Split(string(buf[:m]), "\n")
		pid := -1
		for _, f := range fields {
			if v, ok := strings.CutPrefix(f, "MAINPID="); ok {
				pid, _ = strconv.Atoi(v)
			}
		}
		if slices.Contains(fields, "READY=1") {
			select {
			case n.ready <- pid:
			default:
			}
		}
	}
}

func (n *notifyListener) close() {
	n.l.Close()
	os.RemoveAll(n.dir)
}

// waitNotified waits for READY=1 from pid.
func (n *notifyListener) waitNotified(ctx context.Context, pid int, exited <-chan struct{}) error {
	for {
		select {
		case got := <-n.ready:
			if got == pid {
				return nil
			}
		case <-exited:
			return errExited
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
}

// testHookPollMounts, if set, is called before each wait for the mount
// table to change.
var testHookPollMounts func()

// waitMounted waits until the mount table lists mnt with fstype, then
// stats mnt (answered once the daemon has taken FUSE's INIT). It is for a
// daemon that says nothing when it serves: go-fuse's loopback example,
// run quiet (-q) as the baseline. The kernel flags /proc/self/mountinfo
// (POLLPRI) whenever the mount table changes (proc(5)), so the loop runs
// once per change of the table, whoever's mount it was, not on a timer.
func waitMounted(ctx context.Context, mnt, fstype string, exited <-chan struct{}) error {
	// A raw descriptor: os.Open would register it with Go's epoll, whose
	// poll of the file takes the change notice before unix.Poll sees it.
	fd, err := unix.Open("/proc/self/mountinfo", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("wait for the mount: %w", err)
	}
	defer unix.Close(fd)
	// A pipe the poll also watches: its write end is closed when ctx ends
	// or the daemon exits.
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		return fmt.Errorf("wait for the mount: %w", err)
	}
	defer unix.Close(p[0])
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		select {
		case <-ctx.Done():
		case <-exited:
		case <-stop:
		}
		unix.Close(p[1])
	}()
	// A change after the open and before the poll still wakes it: the
	// open file remembers the table's state when it was opened.
	for {
		if got, ok := mountinfo.MountedAt(mnt); ok && got == fstype {
			break
		}
		if testHookPollMounts != nil {
			testHookPollMounts()
		}
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLPRI}, {Fd: int32(p[0]), Events: unix.POLLIN}}
		if _, err := unix.Poll(fds, -1); err != nil && !errors.Is(err, unix.EINTR) {
			return fmt.Errorf("wait for the mount: poll mountinfo: %w", err)
		}
		if fds[1].Revents != 0 {
			select {
			case <-exited:
				return errExited
			default:
				return context.Cause(ctx)
			}
		}
	}
	_, err = os.Stat(mnt)
	return err
}

// waiter asks a bench daemon's lease socket to wait. A wait holds its
// connection until the daemon answers, and Conn.Close waits for the
// request in flight; so ctx and the daemon's exit are watched beside it,
// and a wait given up on is left to end with the daemon, which the bench
// stops on its way out (closing the connection).
type waiter struct {
	c      *client.Conn
	exited <-chan struct{}
	gaveUp error // a wait is still in flight: the connection is not to be used again
}

func dialWaiter(socket string, exited <-chan struct{}) (*waiter, error) {
	c, err := client.Dial(socket)
	if err != nil {
		return nil, err
	}
	return &waiter{c: c, exited: exited}, nil
}

func (w *waiter) close() {
	if w.gaveUp != nil {
		go w.c.Close()
		return
	}
	w.c.Close()
}

// do runs one request on the connection until it is answered, ctx ends
// or the daemon exits (errExited).
func (w *waiter) do(ctx context.Context, req func(c *client.Conn) error) error {
	if w.gaveUp != nil {
		return w.gaveUp
	}
	done := make(chan error, 1)
	go func() { done <- req(w.c) }()
	select {
	case err := <-done:
		if err != nil {
			select {
			case <-w.exited: // the daemon's exit closed the connection
				return errExited
			default:
			}
		}
		return err
	case <-ctx.Done():
		w.gaveUp = ctx.Err()
	case <-w.exited:
		w.gaveUp = errExited
	}
	return w.gaveUp
}

// state waits until rel's state is one of until, or deadline passes
// (an error wrapping ETIMEDOUT), and returns the state.
func (w *waiter) state(ctx context.Context, rel string, until []string, deadline time.Time) (string, error) {
	left := time.Until(deadline)
	if left <= 0 {
		return "", &proto.Error{Code: syscall.ETIMEDOUT, Msg: "deadline passed"}
	}
	var resp proto.Response
	err := w.do(ctx, func(c *client.Conn) (err error) {
		resp, err = c.Wait(rel, until, left)
		return err
	})
	return resp.State, err
}

// stat is rel's state now.
func (w *waiter) stat(ctx context.Context, rel string) (string, error) {
	var resp proto.Response
	err := w.do(ctx, func(c *client.Conn) (err error) {
		resp, err = c.Stat(rel)
		return err
	})
	return resp.State, err
}

// zero waits until the lease counter key is 0, for at most limit.
func (w *waiter) zero(ctx context.Context, key string, limit time.Duration) error {
	return w.count(ctx, key, 0, limit)
}

// count waits until the lease counter key is value, for at most limit.
func (w *waiter) count(ctx context.Context, key string, value int64, limit time.Duration) error {
	return w.do(ctx, func(c *client.Conn) error { return c.WaitStat(key, value, limit) })
}

// timedOut says whether err is a wait that ran out of time.
func timedOut(err error) bool { return errors.Is(err, syscall.ETIMEDOUT) }

func isFailed(state string) bool { return strings.HasPrefix(state, proto.StateFailed) }
