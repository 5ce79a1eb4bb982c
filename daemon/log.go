package daemon

import (
	"fmt"
	"os"
	"sync"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"golang.org/x/sys/unix"
	"golang.org/x/term"

	"github.com/gdsfs/gdsfs/daemon/config"
)

// newLogger logs to log.file, or stderr: console text on a terminal (or
// when asked), JSON otherwise. The returned logFile is nil for stderr.
func newLogger(c config.Log) (*zap.Logger, *logFile, error) {
	level, err := zapcore.ParseLevel(c.Level)
	if err != nil {
		return nil, nil, err
	}
	tty := c.File == "" && term.IsTerminal(int(os.Stderr.Fd()))
	console := c.Format == "console" || (c.Format == "auto" && tty)
	ec := zap.NewProductionEncoderConfig()
	enc := zapcore.NewJSONEncoder(ec)
	if console {
		ec = zap.NewDevelopmentEncoderConfig()
		ec.EncodeLevel = zapcore.CapitalColorLevelEncoder
		if !tty {
			ec.EncodeLevel = zapcore.CapitalLevelEncoder
		}
		enc = zapcore.NewConsoleEncoder(ec)
	}
	var out zapcore.WriteSyncer = zapcore.Lock(os.Stderr)
	var lf *logFile
	if c.File != "" {
		if lf, err = openLogFile(c.File); err != nil {
			return nil, nil, err
		}
		out = lf
	}
	core := zapcore.NewCore(enc, out, zap.NewAtomicLevelAt(level))
	return zap.New(core, zap.AddCaller(), zap.ErrorOutput(zapcore.Lock(os.Stderr))), lf, nil
}

// logFile is log.file, reopened at its path on SIGHUP (after log
// rotation). The log names other users' paths: a file it creates is 0600,
// and an existing one is opened without following a symbolic link, must
// be a regular file owned by this process's user, and loses any access of
// others.
type logFile struct {
	path string

	mu sync.Mutex
	f  *os.File // guarded by mu
}

func openLogFile(path string) (*logFile, error) {
	f, err := openLogPath(path)
	if err != nil {
		return nil, err
	}
	return &logFile{path: path, f: f}, nil
}

func openLogPath(path string) (*os.File, error) {
	fd, err := unix.Open(path, unix.O_WRONLY|unix.O_APPEND|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0o600)
	if err == unix.ELOOP {
		return nil, fmt.Errorf("log.file %s: is a symbolic link; name the file itself", path)
	}
	if err != nil {
		return nil, fmt.Errorf("log.file %s: %w", path, err)
	}
	if err := checkLogFd(fd); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("log.file %s: %w", path, err)
	}
	return os.NewFile(uintptr(fd), path), nil
}

// checkLogFd checks an opened log file (O_NONBLOCK: a FIFO must not block
// the open) and takes away others' access; it leaves fd blocking.
func checkLogFd(fd int) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return fmt.Errorf("not a regular file")
	}
	if st.Uid != uint32(os.Geteuid()) {
		return fmt.Errorf("owned by uid %d, not this daemon's %d; remove it or name another file", st.Uid, os.Geteuid())
	}
	if st.Mode&0o007 != 0 {
		if err := unix.Fchmod(fd, st.Mode&0o770); err != nil {
			return fmt.Errorf("remove others' access: %w", err)
		}
	}
	return unix.SetNonblock(fd, false)
}

func (l *logFile) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.f.Write(p)
}

func (l *logFile) Sync() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.f.Sync()
}

// Reopen opens the path again, as after log rotation; the old file is
// closed. On failure logging goes on to the old file.
func (l *logFile) Reopen() error {
	f, err := openLogPath(l.path)
	if err != nil {
		return err
	}
	l.mu.Lock()
	old := l.f
	l.f = f
	l.mu.Unlock()
	return old.Close()
}

// Close closes the file.
func (l *logFile) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.f.Close()
}
