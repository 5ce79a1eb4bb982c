// Package handover is the wire between a running gdsfs daemon and the
// successor that takes its mount over: a Unix SEQPACKET socket only the
// daemon's euid may connect to, JSON messages cut into packets, and
// descriptors passed with SCM_RIGHTS in batches.
//
// The exchange, successor first:
//
//	successor: Hello{Protocol, Version, Source, Mountpoint}
//	daemon:    Hello (its own), or Refusal{Error}
//	daemon:    State{parts} + descriptors      (it has stopped serving)
//	successor: Verdict{Taken: true} or Verdict{Error}
//	daemon:    Verdict{Taken: true} once it let go ("gone"); on any
//	           failure, or no verdict by its deadline, it answers
//	           Verdict{Error} where it can and serves again instead.
//
// The successor serves nothing before the daemon's Verdict{Taken: true};
// one whose exchange breaks off after its own verdict serves only when
// the daemon is known to have exited (Conn.PeerAlive).
//
// Protocol is bumped whenever a message changes meaning; a daemon and a
// successor that speak different protocols refuse each other before
// anything stops. This package knows nothing of what the parts hold.
package handover

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Protocol is the hand-over protocol this build speaks.
const Protocol = 1

// Hello opens the exchange from both sides.
type Hello struct {
	Protocol   int    `json:"protocol"`
	Version    string `json:"version"` // gdsfs release, for the logs
	Source     string `json:"source"`
	Mountpoint string `json:"mountpoint"`
	Pid        int    `json:"pid"` // for the logs: it means nothing in another pid namespace (Conn.PeerAlive)
}

// Part is one component's state: its JSON and how many of the message's
// descriptors are its own (they follow each other in the order of the
// parts).
type Part struct {
	Name  string          `json:"name"`
	State json.RawMessage `json:"state"`
	Files int             `json:"files"`
}

// State is everything the daemon hands over.
type State struct {
	Parts []Part `json:"parts"`
}

// Verdict ends the exchange: Taken, or why not.
type Verdict struct {
	Taken bool   `json:"taken"`
	Error string `json:"error,omitempty"`
}

// message is one of the above or a refusal, tagged.
type message struct {
	Hello   *Hello   `json:"hello,omitempty"`
	State   *State   `json:"state,omitempty"`
	Verdict *Verdict `json:"verdict,omitempty"`
	Refusal string   `json:"refusal,omitempty"`
}

const (
	dataPacket = 60 << 10 // JSON bytes per packet
	fdsPacket  = 250      // descriptors per packet (the kernel's SCM_MAX_FD is 253)
	// MaxFiles bounds a message's descriptors: one a staged chunk, one a
	// handle open through the mount.
	MaxFiles = 1 << 20
	// MaxMessage bounds a message's JSON. The cache's state takes about
	// 340 bytes a resident file with a path of 60 bytes, and 17 more a
	// chunk: a million chunks is 16 MiB in files of 1024 chunks, 26 MiB
	// in files of 32, 340 MiB in a million one-chunk files. The body is
	// read as it comes, never allocated from the header's word alone.
	MaxMessage = 512 << 20
)

// Path is where the daemon serving mountpoint listens for a successor,
// beside its lease socket (ipcSocket, the default one for mountpoint).
func Path(ipcSocket string) string {
	return strings.TrimSuffix(ipcSocket, ".sock") + ".handover"
}

// Conn is one side of an exchange.
type Conn struct {
	c *net.UnixConn
	// Peer is the other side's pid, from SO_PEERCRED: 0 when the other
	// side is in a pid namespace this process does not see.
	Peer int
	// pidfd is the other side's process (SO_PEERPIDFD), -1: refused by
	// the kernel (before Linux 6.5).
	pidfd int
}

// newConn wraps c, taking the peer's process descriptor now: it names
// the process that connected or listened, in any pid namespace.
func newConn(c *net.UnixConn, cred *unix.Ucred) (*Conn, error) {
	conn := &Conn{c: c, Peer: int(cred.Pid), pidfd: -1}
	raw, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var perr error
	if err := raw.Control(func(fd uintptr) {
		conn.pidfd, perr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PEERPIDFD)
	}); err != nil {
		return nil, err
	}
	if errors.Is(perr, unix.ENOPROTOOPT) {
		conn.pidfd = -1
	} else if perr != nil {
		return nil, fmt.Errorf("SO_PEERPIDFD: %w", perr)
	} else {
		unix.CloseOnExec(conn.pidfd)
	}
	return conn, nil
}

// ErrPeerUnknown: whether the other side still runs cannot be told.
var ErrPeerUnknown = errors.New("the other side's process cannot be told (no SO_PEERPIDFD, and its pid is not visible in this pid namespace)")

// PeerAlive says whether the other side's process still runs, by its
// process descriptor; where the kernel gave none, by its pid (only
// meaningful in the same pid namespace), and ErrPeerUnknown where that
// is not known either.
func (c *Conn) PeerAlive() (bool, error) {
	if c.pidfd >= 0 {
		fds := []unix.PollFd{{Fd: int32(c.pidfd), Events: unix.POLLIN}}
		for {
			n, err := unix.Poll(fds, 0)
			if err == unix.EINTR {
				continue
			}
			if err != nil {
				return false, fmt.Errorf("poll of the other side's pidfd: %w", err)
			}
			return n == 0, nil // readable: it exited
		}
	}
	if c.Peer <= 0 {
		return false, ErrPeerUnknown
	}
	return !errors.Is(unix.Kill(c.Peer, 0), unix.ESRCH), nil
}

// Listen binds path for successors, mode 0600, replacing a socket a dead
// daemon left. dir must exist and be checked by the caller (it is the
// lease socket's directory).
func Listen(path string) (*net.UnixListener, error) {
	if st, err := os.Lstat(path); err == nil {
		if st.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("%s exists and is not a socket (%s)", path, st.Mode().Type())
		}
		if c, err := net.Dial("unixpacket", path); err == nil {
			c.Close()
			return nil, fmt.Errorf("%s: in use by another daemon", path)
		}
		os.Remove(path)
	}
	old := unix.Umask(0o177)
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	unix.Umask(old)
	if err != nil {
		return nil, err
	}
	ln.SetUnlinkOnClose(true)
	return ln, nil
}

// Accept takes the next successor, refusing (and closing) connections
// from any other uid than the daemon's euid.
func Accept(ln *net.UnixListener) (*Conn, error) {
	for {
		c, err := ln.AcceptUnix()
		if err != nil {
			return nil, err
		}
		cred, err := peerCred(c)
		if err != nil || int(cred.Uid) != os.Geteuid() {
			c.Close()
			continue
		}
		conn, err := newConn(c, cred)
		if err != nil {
			c.Close()
			continue
		}
		return conn, nil
	}
}

// Dial connects to the daemon listening on path. The socket's owner
// must be this process's euid: a successor hands nothing to, and takes
// nothing from, anyone else.
func Dial(path string) (*Conn, error) {
	st, err := os.Lstat(path)
	if err != nil {
		return nil, err
	}
	if st.Mode()&os.ModeSocket == 0 {
		return nil, fmt.Errorf("%s is not a socket", path)
	}
	if uid := st.Sys().(*syscall.Stat_t).Uid; int(uid) != os.Geteuid() {
		return nil, fmt.Errorf("%s belongs to uid %d, not to this daemon's euid %d", path, uid, os.Geteuid())
	}
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return nil, err
	}
	cred, err := peerCred(c)
	if err != nil {
		c.Close()
		return nil, err
	}
	if int(cred.Uid) != os.Geteuid() {
		c.Close()
		return nil, fmt.Errorf("%s is served by uid %d, not by this daemon's euid %d", path, cred.Uid, os.Geteuid())
	}
	conn, err := newConn(c, cred)
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return conn, nil
}

func peerCred(c *net.UnixConn) (*unix.Ucred, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, err
	}
	return cred, cerr
}

// WaitClosed returns once the other side closed the connection; what it
// sends meanwhile is dropped.
func (c *Conn) WaitClosed() {
	buf := make([]byte, dataPacket+1)
	for {
		if _, err := c.c.Read(buf); err != nil {
			return
		}
	}
}

// Close closes the connection.
func (c *Conn) Close() error {
	if c.pidfd >= 0 {
		unix.Close(c.pidfd)
		c.pidfd = -1
	}
	return c.c.Close()
}

// SetDeadline bounds every read and write from now on to t (zero: no
// bound); one past it fails with an error wrapping os.ErrDeadlineExceeded.
func (c *Conn) SetDeadline(t time.Time) error { return c.c.SetDeadline(t) }

// SendHello, SendRefusal, SendState and SendVerdict write one message.
func (c *Conn) SendHello(h Hello) error      { return c.send(message{Hello: &h}, nil) }
func (c *Conn) SendRefusal(why string) error { return c.send(message{Refusal: why}, nil) }
func (c *Conn) SendVerdict(v Verdict) error  { return c.send(message{Verdict: &v}, nil) }
func (c *Conn) SendState(s State, files []*os.File) error {
	n := 0
	for _, p := range s.Parts {
		n += p.Files
	}
	if n != len(files) {
		return fmt.Errorf("hand-over state names %d descriptors, %d given", n, len(files))
	}
	return c.send(message{State: &s}, files)
}

// SendVerdictNow writes a verdict only as far as the socket takes it
// at once (the other side, not reading, may have left it full), for a
// side that answers and closes without waiting.
func (c *Conn) SendVerdictNow(v Verdict) error {
	h, body, err := frame(message{Verdict: &v}, 0)
	if err != nil {
		return err
	}
	raw, err := c.c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		for _, p := range [][]byte{h, body} {
			if serr = unix.Sendmsg(int(fd), p, nil, nil, unix.MSG_DONTWAIT); serr != nil {
				return
			}
		}
	}); err != nil {
		return err
	}
	return serr
}

// RefusedError is the other side's refusal.
type RefusedError struct{ Why string }

func (e RefusedError) Error() string { return "refused: " + e.Why }

// ReadHello reads the other side's Hello and checks its protocol: a
// different one is an error naming both (and is not answered here).
func (c *Conn) ReadHello() (Hello, error) {
	m, _, err := c.read()
	if err != nil {
		return Hello{}, err
	}
	if m.Refusal != "" {
		return Hello{}, RefusedError{m.Refusal}
	}
	if m.Hello == nil {
		return Hello{}, errors.New("hand-over: expected a hello")
	}
	if m.Hello.Protocol != Protocol {
		return *m.Hello, fmt.Errorf("hand-over protocol %d (gdsfs %s, pid %d) is not this daemon's protocol %d",
			m.Hello.Protocol, m.Hello.Version, m.Hello.Pid, Protocol)
	}
	return *m.Hello, nil
}

// ReadState reads the daemon's state and its descriptors; the caller
// owns the files.
func (c *Conn) ReadState() (State, []*os.File, error) {
	m, files, err := c.read()
	if err != nil {
		return State{}, nil, err
	}
	if m.Refusal != "" {
		closeAll(files)
		return State{}, nil, RefusedError{m.Refusal}
	}
	if m.State == nil {
		closeAll(files)
		return State{}, nil, errors.New("hand-over: expected the state")
	}
	return *m.State, files, nil
}

// ReadVerdict reads a verdict.
func (c *Conn) ReadVerdict() (Verdict, error) {
	m, files, err := c.read()
	closeAll(files)
	if err != nil {
		return Verdict{}, err
	}
	if m.Refusal != "" {
		return Verdict{}, RefusedError{m.Refusal}
	}
	if m.Verdict == nil {
		return Verdict{}, errors.New("hand-over: expected a verdict")
	}
	return *m.Verdict, nil
}

// header leads every message: JSON length and descriptor count.
type header struct{ Bytes, Files uint32 }

const headerLen = 8

// frame is m's header and JSON, for a message with files descriptors.
func frame(m message, files int) ([]byte, []byte, error) {
	body, err := json.Marshal(m)
	if err != nil {
		return nil, nil, err
	}
	if len(body) > MaxMessage || files > MaxFiles {
		return nil, nil, fmt.Errorf("hand-over: a message of %d bytes and %d descriptors is beyond what a successor reads (%d bytes, %d descriptors)",
			len(body), files, MaxMessage, MaxFiles)
	}
	h := make([]byte, headerLen)
	binary.LittleEndian.PutUint32(h[:4], uint32(len(body)))
	binary.LittleEndian.PutUint32(h[4:], uint32(files))
	return h, body, nil
}

func (c *Conn) send(m message, files []*os.File) error {
	h, body, err := frame(m, len(files))
	if err != nil {
		return err
	}
	if _, err := c.c.Write(h); err != nil {
		return err
	}
	for len(body) > 0 {
		n := min(len(body), dataPacket)
		if _, err := c.c.Write(body[:n]); err != nil {
			return err
		}
		body = body[n:]
	}
	for len(files) > 0 {
		n := min(len(files), fdsPacket)
		if err := WithFDs(files[:n], func(fds []int) error {
			_, _, err := c.c.WriteMsgUnix([]byte{0}, unix.UnixRights(fds...), nil)
			return err
		}); err != nil {
			return err
		}
		files = files[n:]
	}
	return nil
}

// WithFDs calls fn with the descriptor numbers of files, each held open
// meanwhile. Unlike os.File.Fd it leaves every descriptor's mode alone:
// Fd makes a socket blocking, and a socket's mode is shared with every
// duplicate of it, the serving daemon's included.
func WithFDs(files []*os.File, fn func(fds []int) error) error {
	fds := make([]int, 0, len(files))
	var inner func(i int) error
	inner = func(i int) error {
		if i == len(files) {
			return fn(fds)
		}
		raw, err := files[i].SyscallConn()
		if err != nil {
			return err
		}
		var ferr error
		if err := raw.Control(func(fd uintptr) {
			fds = append(fds, int(fd))
			ferr = inner(i + 1)
		}); err != nil {
			return err
		}
		return ferr
	}
	return inner(0)
}

func (c *Conn) read() (message, []*os.File, error) {
	var m message
	buf := make([]byte, dataPacket+1)
	n, err := c.c.Read(buf)
	if err != nil {
		return m, nil, err
	}
	if n != headerLen {
		return m, nil, fmt.Errorf("hand-over: a header of %d bytes, want %d", n, headerLen)
	}
	h := header{binary.LittleEndian.Uint32(buf[:4]), binary.LittleEndian.Uint32(buf[4:8])}
	if h.Bytes > MaxMessage {
		return m, nil, fmt.Errorf("hand-over: a message of %d bytes is beyond any real state (at most %d)", h.Bytes, MaxMessage)
	}
	if h.Files > MaxFiles {
		return m, nil, fmt.Errorf("hand-over: a message of %d descriptors is beyond any real state (at most %d)", h.Files, MaxFiles)
	}
	body := make([]byte, 0, min(h.Bytes, 1<<20)) // grows as the data comes
	for uint32(len(body)) < h.Bytes {
		n, err := c.c.Read(buf)
		if err != nil {
			return m, nil, err
		}
		if n == 0 || n > dataPacket {
			return m, nil, fmt.Errorf("hand-over: a data packet of %d bytes", n)
		}
		body = append(body, buf[:n]...)
	}
	if uint32(len(body)) != h.Bytes {
		return m, nil, fmt.Errorf("hand-over: %d bytes of JSON, the header said %d", len(body), h.Bytes)
	}
	var files []*os.File
	oob := make([]byte, unix.CmsgSpace(4*fdsPacket))
	for uint32(len(files)) < h.Files {
		_, oobn, flags, _, err := c.c.ReadMsgUnix(buf[:1], oob)
		if err != nil {
			closeAll(files)
			return m, nil, err
		}
		got, err := parseRights(oob[:oobn])
		for _, fd := range got {
			files = append(files, os.NewFile(uintptr(fd), fmt.Sprintf("handover-%d", len(files))))
		}
		if err == nil && flags&unix.MSG_CTRUNC != 0 {
			err = errors.New("hand-over: descriptors were cut off (MSG_CTRUNC): is the descriptor limit too low?")
		}
		if err == nil && len(got) == 0 {
			err = errors.New("hand-over: a descriptor packet without descriptors")
		}
		if err != nil {
			closeAll(files)
			return m, nil, err
		}
	}
	if uint32(len(files)) != h.Files {
		closeAll(files)
		return m, nil, fmt.Errorf("hand-over: %d descriptors, the header said %d", len(files), h.Files)
	}
	if err := json.Unmarshal(body, &m); err != nil {
		closeAll(files)
		return m, nil, fmt.Errorf("hand-over: %w", err)
	}
	return m, files, nil
}

func parseRights(oob []byte) ([]int, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, err
	}
	var fds []int
	for _, msg := range msgs {
		got, err := unix.ParseUnixRights(&msg)
		if err != nil {
			for _, fd := range fds {
				unix.Close(fd)
			}
			return nil, err
		}
		for _, fd := range got {
			unix.CloseOnExec(fd)
		}
		fds = append(fds, got...)
	}
	return fds, nil
}

func closeAll(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}

// CloseFiles closes every file (what a failed exchange received).
func CloseFiles(files []*os.File) { closeAll(files) }

// Split cuts files into the parts' shares, in order.
func Split(s State, files []*os.File) (map[string][]*os.File, error) {
	out := make(map[string][]*os.File, len(s.Parts))
	for _, p := range s.Parts {
		if _, ok := out[p.Name]; ok {
			return nil, fmt.Errorf("hand-over part %s: sent twice", p.Name)
		}
		if p.Files < 0 || p.Files > len(files) {
			return nil, fmt.Errorf("hand-over part %s names %d descriptors, %d left", p.Name, p.Files, len(files))
		}
		out[p.Name], files = files[:p.Files], files[p.Files:]
	}
	if len(files) != 0 {
		return nil, fmt.Errorf("hand-over: %d descriptors belong to no part", len(files))
	}
	return out, nil
}
