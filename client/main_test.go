package client_test

import (
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gdsfs/gdsfs/client"
)

// The examples lease from a real gdsfs mount (host backend) of a
// directory holding the files they name, mounted on first use and
// unmounted once the tests ran. Mounting needs root and /dev/fuse; without
// them the examples do not run, and TestMain says so.

var demo struct {
	once   sync.Once
	dir    string // holds src/, mnt/, the binary and the lease socket
	mnt    string
	cmd    *exec.Cmd
	exited chan error // cmd's exit
	err    error
}

func TestMain(m *testing.M) {
	flag.Parse()
	if why := mountUnavailable(); why != "" {
		if run := flag.Lookup("test.run"); run.Value.String() == "" {
			run.Value.Set("^Test")
		}
		fmt.Fprintf(os.Stderr, "\n*** SKIPPED: the client's examples (they mount gdsfs): %s\n\n", why)
	}
	code := m.Run()
	if demo.cmd != nil {
		demo.cmd.Process.Signal(syscall.SIGTERM)
		<-demo.exited
		syscall.Unmount(demo.mnt, syscall.MNT_DETACH) // where the daemon did not
	}
	if demo.dir != "" {
		os.RemoveAll(demo.dir)
	}
	os.Exit(code)
}

func mountUnavailable() string {
	if os.Geteuid() != 0 {
		return "mounting FUSE needs root"
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		return "no /dev/fuse: " + err.Error()
	}
	return ""
}

// demoMount returns the mount point of the examples' gdsfs mount, whose
// source holds hello.txt and shards/shard-0.bin to shard-2.bin.
func demoMount() string {
	demo.once.Do(func() { demo.err = startDemo() })
	if demo.err != nil {
		panic(fmt.Sprintf("the examples' gdsfs mount: %v", demo.err))
	}
	return demo.mnt
}

func startDemo() error {
	dir, err := os.MkdirTemp("", "gdsfs-example-")
	if err != nil {
		return err
	}
	demo.dir = dir
	src, mnt := filepath.Join(dir, "src"), filepath.Join(dir, "mnt")
	files := map[string][]byte{"hello.txt": []byte("hello from gdsfs\n")}
	for i := range 3 {
		files[fmt.Sprintf("shards/shard-%d.bin", i)] = slices.Repeat([]byte{byte(i)}, (i+1)<<20)
	}
	for name, data := range files {
		p := filepath.Join(src, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, data, 0o644); err != nil {
			return err
		}
	}
	if err := os.Mkdir(mnt, 0o755); err != nil {
		return err
	}
	bin := os.Getenv("GDSFS_BIN")
	if bin == "" {
		bin = filepath.Join(dir, "gdsfs")
		build := exec.Command("go", "build", "-o", bin, "../cmd/gdsfs")
		if out, err := build.CombinedOutput(); err != nil {
			return fmt.Errorf("go build ../cmd/gdsfs: %v\n%s", err, out)
		}
	}
	// The daemon says READY=1 on $NOTIFY_SOCKET once it serves the mount
	// and the lease socket, as it tells systemd.
	notify := filepath.Join(dir, "notify")
	ln, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: notify, Net: "unixgram"})
	if err != nil {
		return err
	}
	defer ln.Close()
	log, err := os.Create(filepath.Join(dir, "daemon.log"))
	if err != nil {
		return err
	}
	defer log.Close()
	cmd := exec.Command(bin, "mount", "--set", "log.format=console", "--set", "staging.device=host",
		"--set", "ipc.socket="+filepath.Join(dir, "lease.sock"), src, mnt)
	cmd.Env = append(os.Environ(), "NOTIFY_SOCKET="+notify)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		return err
	}
	demo.cmd, demo.mnt = cmd, mnt
	exited := make(chan error, 1)
	demo.exited = exited
	go func() { exited <- cmd.Wait() }()
	ready := make(chan struct{})
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := ln.Read(buf)
			if err != nil {
				return
			}
			if slices.Contains(strings.Split(string(buf[:n]), "\n"), "READY=1") {
				close(ready)
				return
			}
		}
	}()
	select {
	case <-ready:
	case err := <-exited:
		demo.cmd = nil
		return fmt.Errorf("gdsfs exited before mounting: %v\n%s", err, daemonLog())
	case <-time.After(60 * time.Second):
		return fmt.Errorf("gdsfs did not say READY=1 in 60s\n%s", daemonLog())
	}
	// On a machine with a GPU the client would name it; the examples'
	// mount stages into host memory.
	os.Setenv("GDSFS_DEVICE", "none")
	client.DropCache()
	return nil
}

func daemonLog() string {
	b, _ := os.ReadFile(filepath.Join(demo.dir, "daemon.log"))
	return string(b)
}
