package fs

import (
	"bytes"
	"context"
	"fmt"
	"path"
	"strings"
	"sync"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/internal/access"
)

const controlDirName = ".gdsfs"

// Reserved inode numbers, far above what the loopback derives from SOURCE.
const controlIno = 0xffff_ffff_ffff_0000

// controlDir is MOUNTPOINT/.gdsfs: one persistent child per Control.
type controlDir struct {
	gofs.Inode
	srv *Server
}

var _ = (gofs.NodeOnAdder)((*controlDir)(nil))

func (d *controlDir) OnAdd(ctx context.Context) {
	for i, c := range d.srv.controls {
		f := &controlFile{srv: d.srv, ctl: c}
		d.AddChild(c.Name, d.NewPersistentInode(ctx, f,
			gofs.StableAttr{Mode: syscall.S_IFREG, Ino: controlIno + 1 + uint64(i)}), false)
	}
}

var _ = (gofs.NodeGetattrer)((*controlDir)(nil))

func (d *controlDir) Getattr(ctx context.Context, f gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	d.fillAttr(&out.Attr)
	return 0
}

func (d *controlDir) fillAttr(a *fuse.Attr) {
	a.Mode = syscall.S_IFDIR | 0o555
	a.Nlink = 2
	a.Ino = controlIno
	d.srv.fillOwner(a)
}

func (s *Server) fillOwner(a *fuse.Attr) {
	a.Uid, a.Gid = s.uid, s.gid
	t := uint64(s.started.Unix())
	a.Atime, a.Mtime, a.Ctime = t, t, t
}

// controlFile is one readable or writable control file.
type controlFile struct {
	gofs.Inode
	srv *Server
	ctl Control
}

var _ = (gofs.NodeGetattrer)((*controlFile)(nil))

func (c *controlFile) Getattr(ctx context.Context, f gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	out.Mode = syscall.S_IFREG | 0o444
	if c.ctl.Write != nil {
		out.Mode = syscall.S_IFREG | 0o200
		if c.srv.opts.AllowOther {
			out.Mode = syscall.S_IFREG | 0o222
		}
	}
	out.Nlink = 1
	c.srv.fillOwner(&out.Attr)
	return 0
}

var _ = (gofs.NodeSetattrer)((*controlFile)(nil))

// Setattr accepts truncation (shell redirection opens with O_TRUNC) and
// nothing else.
func (c *controlFile) Setattr(ctx context.Context, f gofs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if _, ok := in.GetSize(); !ok || c.ctl.Write == nil {
		return syscall.EPERM
	}
	return c.Getattr(ctx, f, out)
}

var _ = (gofs.NodeOpener)((*controlFile)(nil))

// Open snapshots a readable file's content for the reader, or notes the
// writer of a writable one. Both are served with direct I/O: their size is
// unknown.
func (c *controlFile) Open(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	acc := flags & syscall.O_ACCMODE
	cred, ok := c.srv.caller(ctx)
	if !ok {
		return nil, 0, syscall.EACCES
	}
	if c.ctl.Write == nil {
		if acc != syscall.O_RDONLY {
			return nil, 0, syscall.EACCES
		}
		return &controlReader{data: c.ctl.Read(cred)}, fuse.FOPEN_DIRECT_IO, 0
	}
	if acc == syscall.O_RDONLY {
		return nil, 0, syscall.EACCES
	}
	if cred.UID != 0 && cred.UID != c.srv.uid && !c.srv.opts.AllowOther {
		return nil, 0, syscall.EACCES
	}
	return &controlWriter{file: c, cred: cred}, fuse.FOPEN_DIRECT_IO, 0
}

var _ = (gofs.NodeReader)((*controlFile)(nil))

func (c *controlFile) Read(ctx context.Context, f gofs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	r, ok := f.(*controlReader)
	if !ok {
		return nil, syscall.EBADF
	}
	if off >= int64(len(r.data)) {
		return fuse.ReadResultData(nil), 0
	}
	return fuse.ReadResultData(r.data[off:min(int64(len(r.data)), off+int64(len(dest)))]), 0
}

var _ = (gofs.NodeWriter)((*controlFile)(nil))

func (c *controlFile) Write(ctx context.Context, f gofs.FileHandle, data []byte, off int64) (uint32, syscall.Errno) {
	w, ok := f.(*controlWriter)
	if !ok {
		return 0, syscall.EBADF
	}
	return w.write(data, false)
}

var _ = (gofs.NodeFlusher)((*controlFile)(nil))

// Flush acts on a last line written without a newline.
func (c *controlFile) Flush(ctx context.Context, f gofs.FileHandle) syscall.Errno {
	if w, ok := f.(*controlWriter); ok {
		_, errno := w.write(nil, true)
		return errno
	}
	return 0
}

type controlReader struct{ data []byte }

// maxControlLine bounds one line written to a control file: a path of
// PATH_MAX bytes and its arguments. A longer line is refused whole.
const maxControlLine = unix.PathMax + 256

// controlWriter buffers a partial line between writes.
type controlWriter struct {
	file *controlFile
	cred access.Cred // the writer

	mu sync.Mutex
	// INVARIANT: len(partial) <= maxControlLine.
	partial []byte // guarded by mu
	// overlong: the line being written passed maxControlLine; the rest of
	// it, up to its newline, is dropped. Guarded by mu.
	overlong bool
}

// write acts on every complete line of data (and on the partial line when
// final). The first failing line's error is the write's errno; the lines
// after it are still acted on. A line longer than maxControlLine fails
// with ENAMETOOLONG and is not buffered.
func (w *controlWriter) write(data []byte, final bool) (uint32, syscall.Errno) {
	lines, first := w.split(data, final)
	for _, l := range lines {
		if errno := w.line(strings.TrimSpace(string(l))); errno != 0 && first == 0 {
			first = errno
		}
	}
	return uint32(len(data)), first
}

// split cuts data, after the buffered partial line, into complete lines
// and keeps the rest. Each byte is copied at most once into the buffer.
func (w *controlWriter) split(data []byte, final bool) (lines [][]byte, errno syscall.Errno) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			break
		}
		if l, ok := w.takeLocked(data[:i]); ok {
			lines = append(lines, l)
		} else {
			errno = syscall.ENAMETOOLONG
		}
		w.overlong = false
		data = data[i+1:]
	}
	switch {
	case len(data) == 0:
	case w.overlong || len(w.partial)+len(data) > maxControlLine:
		w.refuseLocked(data)
		errno = syscall.ENAMETOOLONG
	default:
		w.partial = append(w.partial, data...)
	}
	if final {
		if len(w.partial) > 0 {
			lines = append(lines, w.partial)
		}
		w.partial, w.overlong = nil, false
	}
	return lines, errno
}

// takeLocked ends the buffered line with tail and returns it; false when
// the line is over-long. The caller holds mu.
func (w *controlWriter) takeLocked(tail []byte) ([]byte, bool) {
	if w.overlong || len(w.partial)+len(tail) > maxControlLine {
		w.refuseLocked(tail)
		return nil, false
	}
	l := tail
	if len(w.partial) > 0 {
		l = append(w.partial, tail...)
	}
	w.partial = nil
	return l, true
}

// refuseLocked drops the over-long line being written (buffered part and
// more), logging it once, clipped. The caller holds mu.
func (w *controlWriter) refuseLocked(more []byte) {
	if !w.overlong {
		head := w.partial
		if len(head) == 0 {
			head = more
		}
		w.file.srv.log.Info("control write refused: line longer than the limit",
			zap.String("control", w.file.ctl.Name), zap.Int("limit", maxControlLine),
			zap.String("line_starts", clip(string(head))))
	}
	w.partial, w.overlong = nil, true
}

// clip shortens s for a log line.
func clip(s string) string {
	const n = 128
	if len(s) <= n {
		return s
	}
	return fmt.Sprintf("%s... (%d bytes)", s[:n], len(s))
}

func (w *controlWriter) line(text string) syscall.Errno {
	if text == "" {
		return 0
	}
	s := w.file.srv
	text, args := splitArgs(text, w.file.ctl.WriteArgs != nil)
	rel, err := s.relPath(text)
	if err != nil {
		s.log.Info("control write refused", zap.Error(err))
		return syscall.EINVAL
	}
	// The writer must be able to read the file, and it must be a regular
	// file: opened as the writer, never blocking (a FIFO would wait for a
	// writer forever).
	f, _, err := s.root.OpenRegular(w.cred, rel, 0, access.Beneath)
	if err != nil {
		s.log.Info("control write refused", zap.String("path", rel), zap.Error(err))
		return s.errs.toErrno(err)
	}
	if args != "" {
		err = w.file.ctl.WriteArgs(w.cred, rel, args)
	} else {
		err = w.file.ctl.Write(w.cred, rel)
	}
	f.Close()
	return s.errs.toErrno(err)
}

// splitArgs splits "PATH<TAB>key=value" (when the control takes
// arguments and the text after the last TAB is key=value with a key of
// lowercase letters and _) into the path and the arguments.
func splitArgs(text string, takes bool) (path, args string) {
	i := strings.LastIndexByte(text, '\t')
	if !takes || i < 0 {
		return text, ""
	}
	key, _, ok := strings.Cut(text[i+1:], "=")
	if !ok || key == "" || strings.TrimFunc(key, func(r rune) bool { return r >= 'a' && r <= 'z' || r == '_' }) != "" {
		return text, ""
	}
	return strings.TrimSpace(text[:i]), text[i+1:]
}

// relPath turns a line written to a control file into a path relative to
// SOURCE: relative to the mount, absolute under the mountpoint, or
// absolute from the mount's root ("/data/x" is "data/x").
func (s *Server) relPath(line string) (string, error) {
	p := line
	if rest, ok := strings.CutPrefix(p, s.mountpoint+"/"); ok {
		p = rest
	}
	p = path.Clean("/" + p)[1:]
	if p == "" || p == controlDirName || strings.HasPrefix(p, controlDirName+"/") {
		return "", fmt.Errorf("%q does not name a file under the mount", clip(line))
	}
	return p, nil
}

// The control directory's entries are the daemon's: every change is
// refused (go-fuse would otherwise take a missing method for success and
// drop the child from the tree).
var (
	_ = (gofs.NodeUnlinker)((*controlDir)(nil))
	_ = (gofs.NodeRmdirer)((*controlDir)(nil))
	_ = (gofs.NodeRenamer)((*controlDir)(nil))
	_ = (gofs.NodeMkdirer)((*controlDir)(nil))
	_ = (gofs.NodeCreater)((*controlDir)(nil))
	_ = (gofs.NodeSymlinker)((*controlDir)(nil))
	_ = (gofs.NodeLinker)((*controlDir)(nil))
	_ = (gofs.NodeMknoder)((*controlDir)(nil))
)

func (d *controlDir) Unlink(ctx context.Context, name string) syscall.Errno { return syscall.EPERM }
func (d *controlDir) Rmdir(ctx context.Context, name string) syscall.Errno  { return syscall.EPERM }
func (d *controlDir) Rename(ctx context.Context, name string, newParent gofs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	return syscall.EPERM
}
func (d *controlDir) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	return nil, syscall.EPERM
}
func (d *controlDir) Create(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut) (*gofs.Inode, gofs.FileHandle, uint32, syscall.Errno) {
	return nil, nil, 0, syscall.EPERM
}
func (d *controlDir) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	return nil, syscall.EPERM
}
func (d *controlDir) Link(ctx context.Context, target gofs.InodeEmbedder, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	return nil, syscall.EPERM
}
func (d *controlDir) Mknod(ctx context.Context, name string, mode, rdev uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	return nil, syscall.EPERM
}
