package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/internal/mountinfo"
)

// daemon is a filesystem daemon the bench started: gdsfs itself
// (self-exec) or the go-fuse loopback example. It runs in its own process
// group, so a Ctrl-C reaches only the bench, which unmounts in order.
type daemon struct {
	name    string
	mnt     string
	logPath string // the daemon's stdout and stderr
	cmd     *exec.Cmd
	exited  chan struct{} // closed once cmd.Wait returned; waitErr is set before
	waitErr error
}

// unavailableError is a row the kernel cannot provide (passthrough refused).
type unavailableError struct{ reason string }

func (u *unavailableError) Error() string { return "unavailable: " + u.reason }

var errExited = errors.New("daemon exited")

const (
	mountTimeout = 30 * time.Second
	stopTimeout  = 15 * time.Second
)

// startDaemon runs argv and waits, as ready says, until it serves mnt.
// On error nothing of it is left running or mounted.
func startDaemon(ctx context.Context, name, mnt, logPath string, argv []string, ready readiness) (*daemon, error) {
	logf, err := createFile(logPath, 0o644)
	if err != nil {
		return nil, fmt.Errorf("%s: daemon log: %w", name, err)
	}
	defer logf.Close() // the child holds its own copy
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Pdeathsig: should the bench die, the daemon unmounts on SIGTERM.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	var notify *notifyListener
	if ready.notify {
		if notify, err = listenNotify(); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		cmd.Env = append(os.Environ(), "NOTIFY_SOCKET="+notify.path())
	}
	if err := cmd.Start(); err != nil {
		if notify != nil {
			notify.close()
		}
		return nil, fmt.Errorf("%s: start %s: %w", name, argv[0], err)
	}
	d := &daemon{name: name, mnt: mnt, logPath: logPath, cmd: cmd, exited: make(chan struct{})}
	go func() {
		d.waitErr = cmd.Wait()
		close(d.exited)
		if notify != nil {
			notify.close() // open until now: gdsfs says STOPPING=1 there
		}
	}()
	wctx, cancel := context.WithTimeoutCause(ctx, mountTimeout, fmt.Errorf("not done after %v", mountTimeout))
	defer cancel()
	if notify != nil {
		err = notify.waitNotified(wctx, cmd.Process.Pid, d.exited)
	} else {
		err = waitMounted(wctx, mnt, ready.fstype, d.exited)
	}
	switch {
	case err == nil:
		return d, nil
	case errors.Is(err, errExited):
		return nil, d.startFailure()
	default:
		return nil, errors.Join(fmt.Errorf("%s: waiting for the mount on %s: %w", name, mnt, err), d.stop())
	}
}

// readiness: gdsfs says READY=1; the loopback shows in the mount table.
func (fsys mountFS) readiness() readiness {
	if fsys.gdsfs {
		return readiness{notify: true}
	}
	return readiness{fstype: "fuse.loopback"}
}

// startFailure explains a daemon that exited before mounting. gdsfs with
// fuse.passthrough=on exits with "fuse.passthrough: on, but REASON" where
// the kernel refuses passthrough: that row is unavailable, not an error.
func (d *daemon) startFailure() error {
	tail := d.logTail()
	const refused = "fuse.passthrough: on, but "
	if i := strings.LastIndex(tail, refused); i >= 0 {
		reason, _, _ := strings.Cut(tail[i+len(refused):], "\n")
		return &unavailableError{reason: "kernel refuses passthrough: " + strings.TrimSpace(reason)}
	}
	return fmt.Errorf("%s exited before mounting %s (%v); its log %s ends:\n%s", d.name, d.mnt, d.waitErr, d.logPath, tail)
}

// logTail is the end of the daemon's log.
func (d *daemon) logTail() string {
	b, err := os.ReadFile(d.logPath)
	if err != nil {
		return fmt.Sprintf("(cannot read the log: %v)", err)
	}
	const max = 2000
	if len(b) > max {
		b = b[len(b)-max:]
	}
	return strings.TrimSpace(string(b))
}

// stop unmounts by SIGTERM and waits for the daemon to exit. A daemon that
// does not exit has its mount detached, then is killed. It returns an
// error only if the mount could not be removed cleanly.
func (d *daemon) stop() error {
	select {
	case <-d.exited:
		return d.unmountLeftover()
	default:
	}
	d.cmd.Process.Signal(syscall.SIGTERM)
	if d.waitExit(stopTimeout) {
		if d.waitErr != nil {
			fmt.Fprintf(os.Stderr, "gdsfs bench mount: %s exited with %v on SIGTERM (log %s)\n", d.name, d.waitErr, d.logPath)
		}
		return d.unmountLeftover()
	}
	// Still serving: the unmount failed (busy?). Detach it so the daemon
	// sees the unmount, and kill it if even that does not end it.
	derr := unix.Unmount(d.mnt, unix.MNT_DETACH)
	if !d.waitExit(5 * time.Second) {
		d.cmd.Process.Kill()
		<-d.exited
	}
	return errors.Join(fmt.Errorf("%s did not unmount %s on SIGTERM; detached it (%v) and stopped the daemon", d.name, d.mnt, derr),
		d.unmountLeftover())
}

func (d *daemon) waitExit(limit time.Duration) bool {
	t := time.NewTimer(limit)
	defer t.Stop()
	select {
	case <-d.exited:
		return true
	case <-t.C:
		return false
	}
}

// unmountLeftover detaches a mount its exited daemon left behind.
func (d *daemon) unmountLeftover() error {
	if _, ok := mountinfo.MountedAt(d.mnt); !ok {
		return nil
	}
	if err := unix.Unmount(d.mnt, unix.MNT_DETACH); err != nil {
		return fmt.Errorf("%s: %s is still mounted after the daemon exited: unmount: %w", d.name, d.mnt, err)
	}
	return fmt.Errorf("%s: %s was still mounted after the daemon exited; detached it", d.name, d.mnt)
}

// readCount is how many reads the daemon has served: reads_served of
// gdsfs's stats.json, or for another daemon its read system calls (each
// FUSE request it takes is one read of /dev/fuse).
func (d *daemon) readCount(gdsfs bool) (uint64, error) {
	if gdsfs {
		st, err := readStats(d.mnt)
		return st.ReadsServed, err
	}
	return procReadSyscalls(d.cmd.Process.Pid)
}

// procReadSyscalls is syscr of /proc/PID/io.
func procReadSyscalls(pid int) (uint64, error) {
	path := fmt.Sprintf("/proc/%d/io", pid)
	f, err := os.Open(path)
	if err != nil {
		return 0, fmt.Errorf("count the daemon's reads: %w", err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), "syscr:"); ok {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("count the daemon's reads: %s: %w", path, err)
			}
			return n, nil
		}
	}
	return 0, fmt.Errorf("count the daemon's reads: no syscr in %s", path)
}

// mountStats is the part of MOUNT/.gdsfs/stats.json the bench reads.
type mountStats struct {
	Passthrough       bool   `json:"passthrough"`
	PassthroughReason string `json:"passthrough_reason"`
	ReadsServed       uint64 `json:"reads_served"`
}

func readStats(mnt string) (mountStats, error) {
	var st mountStats
	path := filepath.Join(mnt, ".gdsfs", "stats.json")
	b, err := os.ReadFile(path)
	if err != nil {
		return st, fmt.Errorf("read stats: %w", err)
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return st, fmt.Errorf("read stats: %s: %w", path, err)
	}
	return st, nil
}
