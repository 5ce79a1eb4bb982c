package ipc

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path"
	"strings"
	"syscall"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/internal/perm"
	"github.com/gdsfs/gdsfs/staging"
)

// maxFDs is the kernel's limit of descriptors in one SCM_RIGHTS message.
const maxFDs = 253

// conn is one client connection; it is served by one goroutine.
type conn struct {
	s      *Server
	c      *net.UnixConn
	cred   perm.Cred
	credOK error // why the peer's credentials are unknown, if they are
	leases map[uint64]*staging.Lease
}

var errTooLong = errors.New("request too long")

func (s *Server) serveConn(c *net.UnixConn) {
	defer s.wg.Done()
	cn := &conn{s: s, c: c, leases: map[uint64]*staging.Lease{}}
	defer cn.close()
	s.mu.Lock()
	tooMany := len(s.active) > s.cfg.Options.MaxConnections
	s.mu.Unlock()
	if tooMany {
		cn.send(cn.fail(syscall.EMFILE, fmt.Errorf("more than ipc.max_connections (%d) clients", s.cfg.Options.MaxConnections)), nil)
		return
	}
	cn.cred, cn.credOK = peerCred(c)
	r := bufio.NewReaderSize(c, 4096)
	for {
		line, err := readLine(r, int(s.cfg.Options.MaxRequest))
		if errors.Is(err, errTooLong) {
			s.bad.Add(1)
			cn.send(cn.fail(syscall.E2BIG, fmt.Errorf("request longer than ipc.max_request (%s)", s.cfg.Options.MaxRequest)), nil)
			return // the stream cannot be resynchronised
		}
		if err != nil {
			return // EOF, a half request, or Close
		}
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		s.requests.Add(1)
		resp, files := cn.handle(line)
		err = cn.send(resp, files)
		for _, f := range files {
			f.Close()
		}
		if err != nil {
			return
		}
	}
}

func (cn *conn) close() {
	for id, l := range cn.leases {
		l.Release()
		delete(cn.leases, id)
	}
	cn.c.Close()
	cn.s.mu.Lock()
	delete(cn.s.active, cn.c)
	cn.s.mu.Unlock()
}

// readLine reads one '\n'-terminated line of at most max bytes.
func readLine(r *bufio.Reader, max int) ([]byte, error) {
	var line []byte
	for {
		part, err := r.ReadSlice('\n')
		line = append(line, part...)
		if len(line) > max {
			return nil, errTooLong
		}
		switch {
		case err == nil:
			return line, nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF) && len(line) > 0:
			return nil, io.ErrUnexpectedEOF
		default:
			return nil, err
		}
	}
}

func peerCred(c *net.UnixConn) (perm.Cred, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return perm.Cred{}, err
	}
	var uc *unix.Ucred
	var uerr error
	if err := raw.Control(func(fd uintptr) {
		uc, uerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return perm.Cred{}, err
	}
	if uerr != nil {
		return perm.Cred{}, fmt.Errorf("SO_PEERCRED: %w", uerr)
	}
	return perm.ForPID(uc.Pid, uc.Uid, uc.Gid)
}

func (cn *conn) handle(line []byte) (Response, []*os.File) {
	var req Request
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		cn.s.bad.Add(1)
		return cn.fail(syscall.EINVAL, fmt.Errorf("malformed request: %v", err)), nil
	}
	switch req.Op {
	case OpAcquire:
		return cn.acquire(req)
	case OpRelease:
		return cn.release(req), nil
	case OpStat:
		return cn.stat(req), nil
	default:
		cn.s.bad.Add(1)
		return cn.fail(syscall.EINVAL, fmt.Errorf("unknown op %q (want acquire, release or stat)", req.Op)), nil
	}
}

func (cn *conn) acquire(req Request) (Response, []*os.File) {
	s := cn.s
	rel, st, err := cn.checkAccess(req.Path)
	if err != nil {
		return cn.failErr(err), nil
	}
	ctx, cancel := context.WithTimeout(s.ctx, s.cfg.Options.AcquireTimeout)
	defer cancel()
	l, err := s.cfg.Cache.Acquire(ctx, staging.Request{Rel: rel, Private: s.cfg.Options.Sharing == SharingPrivate})
	if err != nil {
		return cn.failErr(err), nil
	}
	if dev, ino := l.Inode(); dev != st.Dev || ino != st.Ino {
		// Renamed or replaced between the check and the load: what was
		// staged is not what the peer was allowed to read.
		l.Release()
		return cn.fail(syscall.EAGAIN, fmt.Errorf("%s changed while it was being leased; try again", rel)), nil
	}
	chunks := l.Chunks()
	if len(chunks) > maxFDs {
		l.Release()
		return cn.fail(syscall.EFBIG, fmt.Errorf("%s: %d chunks, more than %d descriptors fit in one message; raise staging.chunk_size", rel, len(chunks), maxFDs)), nil
	}
	files, err := l.Export()
	if err != nil {
		l.Release()
		return cn.failErr(fmt.Errorf("export %s: %w", rel, err)), nil
	}
	id := s.nextLease.Add(1)
	cn.leases[id] = l
	resp := Response{
		OK: true, Epoch: s.epoch, Lease: id, Size: l.Size(), Generation: l.Generation(),
		Device: l.Device(), Sharing: s.cfg.Options.Sharing,
	}
	for _, n := range chunks {
		resp.Chunks = append(resp.Chunks, Chunk{Len: n})
	}
	s.log.Debug("lease", zap.String("path", rel), zap.Uint64("lease", id), zap.Uint32("uid", cn.cred.UID))
	return resp, files
}

func (cn *conn) release(req Request) Response {
	if req.Epoch != 0 && req.Epoch != cn.s.epoch {
		return cn.fail(syscall.ESTALE, fmt.Errorf("lease %d is from another daemon instance (epoch %d); it ended with it", req.Lease, req.Epoch))
	}
	l, ok := cn.leases[req.Lease]
	if !ok {
		return cn.fail(syscall.EINVAL, fmt.Errorf("no lease %d on this connection", req.Lease))
	}
	delete(cn.leases, req.Lease)
	l.Release()
	return Response{OK: true, Epoch: cn.s.epoch}
}

func (cn *conn) stat(req Request) Response {
	rel, st, err := cn.checkAccess(req.Path)
	if err != nil {
		return cn.failErr(err)
	}
	state, loadPath := cn.s.cfg.Cache.Attr(rel)
	return Response{OK: true, Epoch: cn.s.epoch, State: state, LoadPath: loadPath, Size: st.Size}
}

// checkAccess turns a request path into a SOURCE-relative one with no
// symbolic links left and checks that the peer could read it: search
// permission on every directory the walk passes through (links included)
// and read permission on the file. It returns the file's attributes, so
// the caller can check that the file leased is the file checked.
func (cn *conn) checkAccess(p string) (string, *syscall.Stat_t, error) {
	s := cn.s
	if rest, ok := strings.CutPrefix(p, s.cfg.Mountpoint+"/"); ok {
		p = rest
	}
	rel := path.Clean("/" + p)[1:]
	if rel == "" || p == "" {
		return "", nil, fmt.Errorf("path %q: does not name a file under the mount: %w", p, syscall.EINVAL)
	}
	if cn.credOK != nil {
		s.denied.Add(1)
		return "", nil, fmt.Errorf("%s: peer credentials unknown (%v): %w", rel, cn.credOK, syscall.EACCES)
	}
	resolved, st, err := perm.Resolve(s.cfg.Source, rel, cn.cred)
	if err != nil {
		if errors.Is(err, syscall.EACCES) {
			s.denied.Add(1)
		}
		return "", nil, err
	}
	if !perm.CanRead(st, cn.cred) {
		s.denied.Add(1)
		return "", nil, fmt.Errorf("%s: uid %d may not read it: %w", rel, cn.cred.UID, syscall.EACCES)
	}
	return resolved, st, nil
}

func (cn *conn) fail(errno syscall.Errno, err error) Response {
	return Response{Epoch: cn.s.epoch, Errno: unix.ErrnoName(errno), Error: err.Error()}
}

// failErr answers err with the errno it carries (ETIMEDOUT for a deadline,
// EIO when it carries none).
func (cn *conn) failErr(err error) Response {
	var errno syscall.Errno
	switch {
	case errors.As(err, &errno):
	case errors.Is(err, context.DeadlineExceeded):
		errno = syscall.ETIMEDOUT
	case errors.Is(err, fs.ErrNotExist):
		errno = syscall.ENOENT
	default:
		errno = syscall.EIO
	}
	return cn.fail(errno, err)
}

// send writes one answer line, with files as SCM_RIGHTS.
func (cn *conn) send(resp Response, files []*os.File) error {
	b, err := json.Marshal(resp)
	if err != nil {
		return err
	}
	b = append(b, '\n')
	var oob []byte
	if len(files) > 0 {
		fds := make([]int, len(files))
		for i, f := range files {
			fds[i] = int(f.Fd())
		}
		oob = unix.UnixRights(fds...)
	}
	_, _, err = cn.c.WriteMsgUnix(b, oob, nil)
	return err
}
