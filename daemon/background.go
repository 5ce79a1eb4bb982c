package daemon

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// readyFDEnv names the descriptor on which a daemon started by --daemon
// reports whether its mount came up ("ok", or "CODE message").
const readyFDEnv = "GDSFS_READY_FD"

// inBackground reports whether this process is the detached daemon of a
// `gdsfs mount --daemon`.
func inBackground() bool { return os.Getenv(readyFDEnv) != "" }

// background starts the mount as a detached daemon: this binary again, in
// a new session, working directory /, stdin and stdout /dev/null, stderr
// shared until log.file takes over. It returns once the daemon reports: nil
// when the mount is served, else the daemon's error with its exit status.
func (r Request) background() error {
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("--daemon: find this binary: %w", err)
	}
	args := []string{"mount"}
	if r.Config != "" {
		args = append(args, "--config", absPath(r.Config))
	}
	for _, s := range r.Sets {
		args = append(args, "--set", s)
	}
	args = append(args, "--", absPath(r.Source), absPath(r.Mountpoint))
	pr, pw, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("--daemon: %w", err)
	}
	defer pr.Close()
	cmd := exec.Command(exe, args...)
	cmd.Dir = "/"
	cmd.Env = append(os.Environ(), readyFDEnv+"=3")
	cmd.ExtraFiles = []*os.File{pw}
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	err = cmd.Start()
	pw.Close()
	if err != nil {
		return fmt.Errorf("--daemon: start %s: %w", exe, err)
	}
	msg, _ := io.ReadAll(pr) // until the daemon reports, or exits
	if string(msg) == "ok\n" {
		return cmd.Process.Release()
	}
	werr := cmd.Wait()
	code, text, ok := strings.Cut(string(msg), " ")
	if n, err := strconv.Atoi(code); ok && err == nil {
		return ReportedError{Err: errors.New(text), Code: n, Printed: false}
	}
	return fmt.Errorf("the daemon exited before mounting %s (%v)", r.Mountpoint, werr)
}

// readyPipe is the detached daemon's end of the report; nil in the
// foreground.
type readyPipe struct{ f *os.File }

// readyFromEnv takes the report descriptor --daemon passed, if any, and
// makes the daemon immune to its starter going away (SIGHUP, a closed
// stderr pipe).
func readyFromEnv() *readyPipe {
	v := os.Getenv(readyFDEnv)
	if v == "" {
		return nil
	}
	os.Unsetenv(readyFDEnv)
	fd, err := strconv.Atoi(v)
	if err != nil {
		return nil
	}
	signal.Ignore(syscall.SIGHUP, syscall.SIGPIPE)
	return &readyPipe{f: os.NewFile(uintptr(fd), "ready")}
}

// ok reports the mount served and closes the pipe. A terminal or pipe on
// stderr is then let go (replaced by /dev/null), so that a shell's
// $(gdsfs mount --daemon ...) or a caller reading the output does not wait
// on the daemon: logs go on to log.file, or to a stderr that is a file or
// a socket (the journal, when a systemd unit or mount unit started it).
func (p *readyPipe) ok() {
	if p == nil {
		return
	}
	p.f.WriteString("ok\n")
	p.f.Close()
	var st unix.Stat_t
	if unix.Fstat(2, &st) != nil {
		return
	}
	if t := st.Mode & unix.S_IFMT; t == unix.S_IFCHR || t == unix.S_IFIFO {
		if null, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0); err == nil {
			unix.Dup3(int(null.Fd()), 2, 0)
			null.Close()
		}
	}
}

// fail reports err to the starter, which prints it, and returns it marked
// as already reported.
func (p *readyPipe) fail(err error) error {
	if p == nil {
		return err
	}
	code := ExitCode(err)
	fmt.Fprintf(p.f, "%d %v", code, err)
	p.f.Close()
	return ReportedError{Err: err, Code: code, Printed: true}
}
