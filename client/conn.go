package client

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/proto"
)

// Error is a failure the daemon answered (or a client-side protocol
// failure); errors.Is(err, syscall.EACCES) works on it.
type Error = proto.Error

// Conn is one connection to a daemon's lease socket. Its methods are safe
// for concurrent use; requests on one Conn are answered in turn. Every
// file leased on a Conn stays held by the daemon (counted against its
// capacity) until the Conn is closed.
type Conn struct {
	socket string

	mu      sync.Mutex // serialises request/answer pairs; guards the fields below
	c       *net.UnixConn
	r       *proto.Reader
	pending []string    // ops of the releases and drops whose answers are not read yet
	noDrop  atomic.Bool // the daemon answered drop as an unknown op
	epoch   uint64      // of the last answer
	dead    error       // why the connection is unusable
	failed  atomic.Bool // dead != nil, readable without mu

	qmu    sync.Mutex      // guards queued
	queued []proto.Request // releases and drops not sent yet, in the order they were made (see notice)
}

// connectTimeout bounds connecting to a lease socket (a listener that
// accepts nothing, its backlog full).
var connectTimeout = 10 * time.Second

// untrusted counts the connections refused because of who listened.
var untrusted atomic.Uint64

// Untrusted is how many connections this process refused because of the
// socket's listener (see UntrustedError).
func Untrusted() uint64 { return untrusted.Load() }

// UntrustedError is a lease socket served by a uid other than the mount's
// owner (root for a mount root made), or, where no mount names one, by
// neither root nor this process's euid: nothing was sent to it.
// errors.Is(err, syscall.EPERM) works on it.
type UntrustedError struct {
	Socket string
	Peer   uint32 // the listener's uid (SO_PEERCRED)
	Owner  int    // the mount's owner (-1: no mount; this process's euid was wanted)
}

func (e *UntrustedError) Error() string {
	want := fmt.Sprintf("the mount's owner (uid %d)", e.Owner)
	if e.Owner < 0 {
		want = fmt.Sprintf("root or this process's uid (%d)", os.Geteuid())
	}
	return fmt.Sprintf("gdsfs socket %s: served by uid %d, not %s: refused, nothing was sent", e.Socket, e.Peer, want)
}

// Unwrap gives the errno, EPERM.
func (e *UntrustedError) Unwrap() error { return syscall.EPERM }

// Dial connects to a lease socket whose listener must be root or this
// process's euid (see UntrustedError); Open, Stat and Wait instead want
// the owner of the mount the path is on.
func Dial(socket string) (*Conn, error) { return dial(socket, -1) }

// DialMount connects to the lease socket of the gdsfs mount path is on,
// accepting as its listener that mount's owner only (a root process may
// so talk to the daemon of another user's mount, never another daemon
// root runs), and returns the path to send for path.
func DialMount(path string) (c *Conn, rel string, err error) {
	t, err := find(path)
	if err != nil {
		return nil, "", err
	}
	c, err = dial(t.socket, t.owner)
	return c, t.rel, err
}

// dial connects to socket and checks its listener's uid (SO_PEERCRED)
// before anything is sent: owner, or root or this process's euid when
// owner < 0 (checkPeer).
func dial(socket string, owner int) (*Conn, error) {
	d := net.Dialer{Timeout: connectTimeout}
	nc, err := d.Dial("unix", socket)
	if err != nil {
		return nil, fmt.Errorf("gdsfs socket %s: %w", socket, err)
	}
	c := nc.(*net.UnixConn)
	if err := checkPeer(c, socket, owner); err != nil {
		c.Close()
		return nil, err
	}
	return &Conn{socket: socket, c: c, r: proto.NewReader(c, proto.MaxAnswer)}, nil
}

// checkPeer reads who listens on c and refuses anyone but owner (the
// mount's owner: its daemon runs as that uid), or, for owner < 0, anyone
// but root or this process's euid. Root is not taken for another uid's
// mount: a root listener there is the daemon of another mount (root's),
// which would lease the file of the same relative path in its own SOURCE.
func checkPeer(c *net.UnixConn, socket string, owner int) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return fmt.Errorf("gdsfs socket %s: %w", socket, err)
	}
	var cred *unix.Ucred
	cerr := raw.Control(func(fd uintptr) { cred, err = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) })
	if cerr != nil || err != nil {
		return fmt.Errorf("gdsfs socket %s: reading its listener's credentials: %w", socket, errors.Join(cerr, err))
	}
	ok := int64(cred.Uid) == int64(owner)
	if owner < 0 {
		ok = cred.Uid == 0 || int64(cred.Uid) == int64(os.Geteuid())
	}
	if !ok {
		untrusted.Add(1)
		return &UntrustedError{Socket: socket, Peer: cred.Uid, Owner: owner}
	}
	return nil
}

// Close closes the connection; the daemon ends everything it held.
func (c *Conn) Close() error {
	c.mu.Lock()
	defer c.unlock()
	if c.dead == nil {
		c.dead = errors.New("closed")
	}
	c.failed.Store(true)
	return c.c.Close()
}

// broken reports whether the connection failed or was closed.
func (c *Conn) broken() bool { return c.failed.Load() }

// failLocked marks the connection unusable and closes it, so the daemon
// ends whatever it held. c.mu must be held.
func (c *Conn) failLocked(err error) {
	if c.dead == nil {
		c.dead = err
	}
	c.failed.Store(true)
	c.c.Close()
}

// roundTrip sends one request and reads its answer and descriptors. An
// answer whose descriptors the kernel truncated (MSG_CTRUNC) or that
// carries the wrong number of them closes the connection (ending the
// lease it granted) and is an error.
func (c *Conn) roundTrip(req proto.Request) (proto.Response, []*os.File, error) {
	if err := req.CheckNames(); err != nil {
		return proto.Response{}, nil, &Error{Code: syscall.EILSEQ, Msg: fmt.Sprintf("gdsfs %s: %v", req.Op, err)}
	}
	c.mu.Lock()
	defer c.unlock()
	c.flushLocked() // the releases and drops made before it go first
	if c.dead != nil {
		return proto.Response{}, nil, &Error{Code: syscall.ENOTCONN, Msg: fmt.Sprintf("gdsfs %s: connection unusable: %v", req.Op, c.dead)}
	}
	if err := c.drainLocked(); err != nil {
		c.failLocked(err)
		return proto.Response{}, nil, fmt.Errorf("gdsfs %s: %w", req.Op, err)
	}
	if _, err := c.c.Write(req.Line()); err != nil {
		// The daemon may have answered and hung up before reading (too
		// many connections): its answer says more than EPIPE.
		if resp, ok := c.answerLeftLocked(); ok {
			c.failLocked(err)
			return resp, nil, resp.Err()
		}
		c.failLocked(err)
		return proto.Response{}, nil, fmt.Errorf("gdsfs %s: %w", req.Op, err)
	}
	line, fds, err := c.r.Next()
	if err != nil {
		proto.CloseFDs(fds)
		c.failLocked(err)
		if errors.Is(err, proto.ErrTruncated) {
			return proto.Response{}, nil, &Error{Code: syscall.EMFILE, Msg: fmt.Sprintf(
				"gdsfs %s: %v; the connection was closed, which ends the lease", req.Op, err)}
		}
		return proto.Response{}, nil, fmt.Errorf("gdsfs %s: connection closed by the daemon: %w", req.Op, err)
	}
	resp, err := proto.DecodeResponse(line)
	if err == nil && len(fds) != resp.FDs() {
		err = &Error{Code: syscall.EPROTO, Msg: fmt.Sprintf("%d descriptors for %d chunks", len(fds), resp.FDs())}
	}
	if err != nil {
		proto.CloseFDs(fds)
		c.failLocked(err)
		return proto.Response{}, nil, fmt.Errorf("gdsfs %s: %w", req.Op, err)
	}
	c.epoch = resp.Epoch
	if !resp.OK {
		return resp, nil, resp.Err()
	}
	files := make([]*os.File, len(fds))
	for i, fd := range fds {
		files[i] = os.NewFile(uintptr(fd), "gdsfs-chunk")
	}
	return resp, files, nil
}

// answerLeftLocked reads an error answer already waiting on a connection
// the daemon closed. c.mu must be held.
func (c *Conn) answerLeftLocked() (proto.Response, bool) {
	c.c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	defer c.c.SetReadDeadline(time.Time{})
	line, fds, err := c.r.Next()
	proto.CloseFDs(fds)
	if err != nil {
		return proto.Response{}, false
	}
	resp, err := proto.DecodeResponse(line)
	return resp, err == nil && !resp.OK
}

// drainLocked reads the answers of releases and drops sent earlier. A
// drop answered as an unknown op (a daemon older than drop) marks the
// connection noDrop. c.mu must be held.
func (c *Conn) drainLocked() error {
	for len(c.pending) > 0 {
		op := c.pending[0]
		c.pending = c.pending[1:]
		line, fds, err := c.r.Next()
		proto.CloseFDs(fds)
		if err != nil {
			return fmt.Errorf("reading a %s answer: %w", op, err)
		}
		resp, err := proto.DecodeResponse(line)
		switch {
		case err != nil:
			return err
		case resp.OK:
		case op == proto.OpDrop:
			if resp.Errno == "EINVAL" && strings.Contains(resp.Error, "unknown op") {
				c.noDrop.Store(true)
			}
		case resp.Errno != "ESTALE" && resp.Errno != "EINVAL":
			return fmt.Errorf("release answered: %w", resp.Err())
		}
	}
	return nil
}

// release ends lease id without waiting for the answer (read before the
// next request, or before the next notice once maxUnanswered are unread).
// It never waits for the connection: when it is busy the
// release is sent once the request using it is done (see notice).
func (c *Conn) release(id, epoch uint64) {
	c.notice(proto.Request{Op: proto.OpRelease, Lease: id, Epoch: epoch})
}

// drop stops the daemon holding a generation on a device that this
// connection was granted and this process unmapped, without waiting for
// the answer (as release).
func (c *Conn) drop(generation uint64, device string) {
	if !c.noDrop.Load() {
		c.notice(proto.Request{Op: proto.OpDrop, Generation: generation, Device: device})
	}
}

// notice queues req and sends the queue, in order, once it has the
// connection: at once when no request uses it, else when whoever holds it
// is done with it (unlock), with no goroutine of its own. A drop so never
// overtakes the release made before it (the daemon refuses to drop what a
// lease names), and nothing queued waits for a next request.
func (c *Conn) notice(req proto.Request) {
	c.qmu.Lock()
	c.queued = append(c.queued, req)
	c.qmu.Unlock()
	if c.mu.TryLock() {
		c.unlock()
	}
}

// unlock sends the queued notices and unlocks c.mu. A notice queued after
// the sending, by a caller that found c.mu held, is sent too: here, or by
// whoever took c.mu meanwhile, when it unlocks.
func (c *Conn) unlock() {
	for {
		c.flushLocked()
		c.mu.Unlock()
		c.qmu.Lock()
		more := len(c.queued) > 0
		c.qmu.Unlock()
		if !more || !c.mu.TryLock() {
			return
		}
	}
}

// flushLocked sends the queued notices (those of a closed connection are
// dropped: closing ended what they would). c.mu must be held.
func (c *Conn) flushLocked() {
	c.qmu.Lock()
	q := c.queued
	c.queued = nil
	c.qmu.Unlock()
	for _, req := range q {
		c.noticeLocked(req)
	}
}

// maxUnanswered bounds the notices sent on a connection whose answers
// were not read yet: past it their answers are read before the next is
// sent. Unread, a few hundred answers fill the socket's buffer, the
// daemon blocks writing them and stops reading, and the next notice could
// not be written.
const maxUnanswered = 64

func (c *Conn) noticeLocked(req proto.Request) {
	if c.dead != nil {
		return // closing ended it
	}
	if len(c.pending) >= maxUnanswered {
		c.c.SetReadDeadline(time.Now().Add(noticeTimeout))
		err := c.drainLocked()
		c.c.SetReadDeadline(time.Time{})
		if err != nil {
			c.failLocked(err)
			return
		}
	}
	c.c.SetWriteDeadline(time.Now().Add(noticeTimeout))
	_, err := c.c.Write(req.Line())
	c.c.SetWriteDeadline(time.Time{})
	if err != nil {
		c.failLocked(err) // closing ends the lease (and the hold) as well
		return
	}
	c.pending = append(c.pending, req.Op)
}

// noticeTimeout bounds writing a notice, and reading the answers of
// earlier ones before it (maxUnanswered).
const noticeTimeout = 5 * time.Second

// Stat asks the state of a file without staging it.
func (c *Conn) Stat(path string) (proto.Response, error) {
	resp, _, err := c.roundTrip(proto.Request{Op: proto.OpStat, Path: path})
	return resp, err
}

// Report counts an event the daemon cannot see (proto.EventFallback with
// a reason) in its stats.
func (c *Conn) Report(event, reason string) error {
	_, _, err := c.roundTrip(proto.Request{Op: proto.OpReport, Event: event, Reason: reason})
	return err
}

// Hello asks the daemon's protocol version and operations.
func (c *Conn) Hello() (proto.Response, error) {
	resp, _, err := c.roundTrip(proto.Request{Op: proto.OpHello, Version: proto.Version})
	return resp, err
}

func closeAll(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}
