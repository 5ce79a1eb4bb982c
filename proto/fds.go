package proto

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"

	"golang.org/x/sys/unix"
)

// Send writes one line with fds attached as SCM_RIGHTS: at most MaxFDs
// per sendmsg, so a line with more is cut into pieces, each group of
// descriptors riding on the first byte of its piece (the first group on
// the line's first byte). A short write is completed. The caller keeps
// the descriptors open until Send returns; the kernel gives the peer its
// own.
func Send(c *net.UnixConn, line []byte, fds []int) error {
	groups := (len(fds) + MaxFDs - 1) / MaxFDs
	if groups > len(line) {
		return fmt.Errorf("send: %d descriptors need %d pieces of a %d-byte line", len(fds), groups, len(line))
	}
	if groups == 0 {
		_, err := c.Write(line)
		return err
	}
	off := 0
	for g := 0; g < groups; g++ {
		part := fds[g*MaxFDs : min((g+1)*MaxFDs, len(fds))]
		end := off + 1
		if g == groups-1 {
			end = len(line)
		}
		n, _, err := c.WriteMsgUnix(line[off:end], unix.UnixRights(part...), nil)
		if err != nil {
			return err
		}
		if off+n < end {
			if _, err := c.Write(line[off+n : end]); err != nil {
				return err
			}
		}
		off = end
	}
	return nil
}

// ErrTruncated is wrapped by Reader.Next when the kernel dropped
// descriptors of an answer (MSG_CTRUNC): the process has no room for them
// (RLIMIT_NOFILE) or the control buffer was too small. The answer's lease
// is then unusable: a client must end it (close the connection that holds
// it) and report the error.
var ErrTruncated = errors.New("the kernel dropped descriptors sent with the answer (MSG_CTRUNC; is RLIMIT_NOFILE exhausted?)")

// Reader reads '\n'-terminated lines and the descriptors that arrive with
// them from a Unix stream socket. Descriptors are received close-on-exec.
// A recvmsg that returns descriptors stops after the bytes they ride on, so
// they belong to the line holding the last byte it returned.
type Reader struct {
	c     *net.UnixConn
	max   int
	buf   []byte  // received, not yet returned
	fds   [][]int // fds[i]: descriptors of the i-th line in buf
	trunc []bool  // trunc[i]: MSG_CTRUNC seen while reading line i
	rbuf  []byte
	oob   []byte
}

// NewReader reads lines of at most max bytes from c.
func NewReader(c *net.UnixConn, max int) *Reader {
	return &Reader{c: c, max: max, rbuf: make([]byte, minRead), oob: make([]byte, unix.CmsgSpace(MaxFDs*4))}
}

// A Reader's receive buffer starts at minRead bytes (most answers fit: a
// connection made for one lease zeroes no more) and doubles, up to
// maxRead, each time a read fills it.
const minRead, maxRead = 4 << 10, 64 << 10

// Next returns the next line (without its '\n') and its descriptors, which
// the caller owns. With ErrTruncated it still returns the whole line and
// whatever descriptors arrived, so the stream stays in step. On any other
// error the connection is unusable; descriptors received for lines not yet
// returned are returned for closing.
func (r *Reader) Next() ([]byte, []int, error) {
	for {
		if i := bytes.IndexByte(r.buf, '\n'); i >= 0 {
			line := append([]byte(nil), r.buf[:i]...)
			r.buf = r.buf[i+1:]
			fds, trunc := r.pop()
			if trunc {
				return line, fds, ErrTruncated
			}
			return line, fds, nil
		}
		if len(r.buf) > r.max {
			return nil, r.drain(), Errorf(EPROTO, "answer line longer than %d bytes", r.max)
		}
		n, oobn, flags, _, err := r.c.ReadMsgUnix(r.rbuf, r.oob)
		if n > 0 || oobn > 0 {
			idx := bytes.Count(r.buf, []byte{'\n'})
			if n > 0 {
				idx += bytes.Count(r.rbuf[:n-1], []byte{'\n'})
			}
			for len(r.fds) <= idx {
				r.fds = append(r.fds, nil)
				r.trunc = append(r.trunc, false)
			}
			got, perr := parseRights(r.oob[:oobn])
			r.fds[idx] = append(r.fds[idx], got...)
			if flags&unix.MSG_CTRUNC != 0 || perr != nil {
				r.trunc[idx] = true
			}
			r.buf = append(r.buf, r.rbuf[:n]...)
			if n == len(r.rbuf) && n < maxRead {
				r.rbuf = make([]byte, 2*n)
			}
		}
		switch {
		case err != nil:
			return nil, r.drain(), err
		case n == 0:
			if len(r.buf) > 0 {
				return nil, r.drain(), io.ErrUnexpectedEOF
			}
			return nil, r.drain(), io.EOF
		}
	}
}

// Buffered reports whether bytes of a line not yet returned were read.
func (r *Reader) Buffered() bool { return len(r.buf) > 0 }

func (r *Reader) pop() ([]int, bool) {
	if len(r.fds) == 0 {
		return nil, false
	}
	fds, trunc := r.fds[0], r.trunc[0]
	r.fds, r.trunc = r.fds[1:], r.trunc[1:]
	return fds, trunc
}

func (r *Reader) drain() []int {
	var all []int
	for _, f := range r.fds {
		all = append(all, f...)
	}
	r.fds, r.trunc = nil, nil
	return all
}

// parseRights returns the descriptors of the SCM_RIGHTS messages in oob,
// each marked close-on-exec (recvmsg was asked for it; this makes sure).
func parseRights(oob []byte) ([]int, error) {
	if len(oob) == 0 {
		return nil, nil
	}
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, fmt.Errorf("control message: %w", err)
	}
	var out []int
	for i := range msgs {
		if msgs[i].Header.Level != unix.SOL_SOCKET || msgs[i].Header.Type != unix.SCM_RIGHTS {
			continue
		}
		fds, err := unix.ParseUnixRights(&msgs[i])
		if err != nil {
			return out, err
		}
		for _, fd := range fds {
			unix.CloseOnExec(fd)
		}
		out = append(out, fds...)
	}
	return out, nil
}

// CloseFDs closes descriptors (errors ignored: they are being dropped).
func CloseFDs(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}
