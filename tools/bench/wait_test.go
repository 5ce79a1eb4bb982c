package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/internal/testkit/controltest"
)

// fakeNotifyEnv makes the test binary a fake daemon: it says READY=1 on
// $NOTIFY_SOCKET with MAINPID the value ("self": its own pid), then
// waits for SIGTERM.
const fakeNotifyEnv = "GDSFS_BENCH_FAKE_NOTIFY"

func TestMain(m *testing.M) {
	if v, ok := os.LookupEnv(fakeNotifyEnv); ok {
		os.Exit(fakeNotifyDaemon(v))
	}
	os.Exit(m.Run())
}

func fakeNotifyDaemon(mainpid string) int {
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	if mainpid == "self" {
		mainpid = fmt.Sprint(os.Getpid())
	}
	c, err := net.Dial("unixgram", os.Getenv("NOTIFY_SOCKET"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if _, err := c.Write([]byte("READY=1\nMAINPID=" + mainpid)); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	c.Close()
	<-term
	return 0
}

func startNotifier(t *testing.T, ctx context.Context, mainpid string) (*daemon, error) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(fakeNotifyEnv, mainpid)
	dir := t.TempDir()
	return startDaemon(ctx, "fake", dir, filepath.Join(dir, "log"), []string{exe}, readiness{notify: true})
}

func TestMbStartDaemonNotified(t *testing.T) {
	d, err := startNotifier(t, context.Background(), "self")
	if err != nil {
		t.Fatal(err)
	}
	if err := d.stop(); err != nil {
		t.Fatal(err)
	}
	if d.waitErr != nil {
		t.Fatalf("the fake daemon exited with %v on SIGTERM; log:\n%s", d.waitErr, d.logTail())
	}
}

// READY=1 naming another process is not the daemon's: it is never ready.
func TestMbStartDaemonNotifiedByAnother(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	d, err := startNotifier(t, ctx, "1")
	if d != nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("daemon %v, err = %v; want none and the context's error", d, err)
	}
}

// The mount comes once waitMounted waits for the mount table to change.
func TestMbWaitMounted(t *testing.T) {
	mnt := t.TempDir()
	polling := make(chan struct{}, 8)
	testHookPollMounts = func() { polling <- struct{}{} }
	t.Cleanup(func() { testHookPollMounts = nil })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- waitMounted(ctx, mnt, "tmpfs", nil) }()
	select {
	case <-polling:
	case err := <-done:
		t.Fatalf("waitMounted returned %v before anything was mounted", err)
	}
	if err := unix.Mount("tmpfs", mnt, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatalf("mount a tmpfs (the test runs as root): %v", err)
	}
	t.Cleanup(func() { unix.Unmount(mnt, unix.MNT_DETACH) })
	if err := <-done; err != nil {
		t.Fatalf("waitMounted after the mount: %v", err)
	}
}

func TestMbWaitMountedEnds(t *testing.T) {
	mnt := t.TempDir()
	exited := make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- waitMounted(context.Background(), mnt, "tmpfs", exited) }()
	close(exited)
	if err := <-done; !errors.Is(err, errExited) {
		t.Fatalf("after the daemon exited: %v, want errExited", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() { done <- waitMounted(ctx, mnt, "tmpfs", nil) }()
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("after ctx ended: %v, want context.Canceled", err)
	}
}

// stageAll writes .gdsfs/prefetch one line at a time and asks again for a
// line refused with EAGAIN (the queue is full). The refused write must
// come back: a control file opened with os.OpenFile waits forever in
// Go's poller, and a benchmark staging more files than the queue holds
// would hang.
func TestMbControlFileSeesEAGAIN(t *testing.T) {
	mnt := t.TempDir()
	ctl := filepath.Join(mnt, ".gdsfs")
	if err := os.Mkdir(ctl, 0o755); err != nil {
		t.Fatal(err)
	}
	file := controltest.Mount(t, ctl, "prefetch")
	m := &benchMount{mnt: mnt}
	pf, err := m.controlFile("prefetch")
	if err != nil {
		t.Fatal(err)
	}
	defer pf.Close()
	controltest.RequireBlocking(t, pf)
	if _, err := pf.WriteString("a.bin\n"); !errors.Is(err, unix.EAGAIN) {
		t.Fatalf("refused line: %v, want EAGAIN", err)
	}
	if _, err := pf.WriteString("a.bin\n"); err != nil {
		t.Fatalf("the line asked again: %v", err)
	}
	if got := file.Lines(); len(got) != 1 {
		t.Fatalf("prefetch took %q, want one line", got)
	}
}
