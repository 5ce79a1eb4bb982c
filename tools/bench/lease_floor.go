package bench

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/daemon/config"
	"github.com/gdsfs/gdsfs/gpu"
	"github.com/gdsfs/gdsfs/internal/devices"
)

//go:embed floor.py
var floorScript []byte

// floor measures the raw primitive under a lease, per size: this process
// allocates a region on the mount's kind of device, and each sample
// exports its descriptors, sends them to floor.py (another process) and
// waits until it has imported and mapped them. Unmapping and closing come
// after the clock stops, as a lease's release need not block.
func (lb *leaseBench) floor(ctx context.Context) (map[string][]float64, error) {
	if lb.py == nil {
		return nil, errors.New("no Python interpreter for the importing process")
	}
	cfg, err := config.Load("", lb.o.Sets)
	if err != nil {
		return nil, err
	}
	devs, err := devices.Open(cfg.Staging, zap.NewNop())
	if err != nil {
		return nil, err
	}
	defer devices.Close(devs)
	dev := devs[0]
	if (dev.Kind() == gpu.KindHost) != (lb.res.Device == "host") {
		return nil, fmt.Errorf("this process opened %s but the mount stages on %s", dev.Name(), lb.res.Device)
	}
	script, err := lb.py.write("bench_floor.py", floorScript)
	if err != nil {
		return nil, err
	}
	f, err := startFloor(ctx, lb.py, script, dev)
	if err != nil {
		return nil, err
	}
	defer f.stop()
	out := map[string][]float64{}
	for i, p := range lb.paths() {
		if out[p], err = f.samples(dev, int64(lb.o.Sizes[i]), lb.o.Runs); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// floorChild is floor.py, reached over a SOCK_SEQPACKET pair.
type floorChild struct {
	conn *net.UnixConn
	proc *os.Process
	done chan error
}

func startFloor(ctx context.Context, py *pyEnv, script string, dev gpu.Device) (*floorChild, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	mine, theirs := os.NewFile(uintptr(fds[0]), "floor"), os.NewFile(uintptr(fds[1]), "floor-child")
	defer mine.Close() // FileConn holds its own copy
	c, err := net.FileConn(mine)
	if err != nil {
		theirs.Close()
		return nil, err
	}
	cmd := py.command(ctx, script, dev.Kind(), strconv.Itoa(dev.Ordinal()))
	cmd.ExtraFiles = []*os.File{theirs} // fd 3
	cmd.Stderr = os.Stderr
	err = cmd.Start()
	theirs.Close()
	if err != nil {
		c.Close()
		return nil, err
	}
	f := &floorChild{conn: c.(*net.UnixConn), proc: cmd.Process, done: make(chan error, 1)}
	go func() { f.done <- cmd.Wait() }()
	if _, err := f.recv(time.Minute); err != nil {
		f.stop()
		return nil, fmt.Errorf("floor.py did not start: %w", err)
	}
	return f, nil
}

func (f *floorChild) recv(limit time.Duration) ([]byte, error) {
	buf := make([]byte, 4096)
	f.conn.SetReadDeadline(time.Now().Add(limit))
	n, err := f.conn.Read(buf)
	if err == nil && n == 0 {
		err = errors.New("floor.py closed its end")
	}
	if err == nil && string(buf[:min(n, 6)]) == "error:" {
		err = errors.New(string(buf[:n]))
	}
	return buf[:n], err
}

func (f *floorChild) send(msg []byte, rights []byte) error {
	f.conn.SetWriteDeadline(time.Now().Add(time.Minute))
	_, _, err := f.conn.WriteMsgUnix(msg, rights, nil)
	return err
}

// samples allocates size bytes and times runs export-to-mapped cycles
// (after one untimed), in ms.
func (f *floorChild) samples(dev gpu.Device, size int64, runs int) ([]float64, error) {
	r, err := dev.Alloc(size)
	if err != nil {
		return nil, err
	}
	defer r.Free()
	hdr, _ := json.Marshal(map[string]any{"lens": r.Chunks()})
	var out []float64
	for i := range runs + 1 {
		start := time.Now()
		files, err := r.Export()
		if err != nil {
			return nil, err
		}
		fds := make([]int, len(files))
		for k, fl := range files {
			fds[k] = int(fl.Fd())
		}
		err = f.send(hdr, unix.UnixRights(fds...))
		if err == nil {
			_, err = f.recv(time.Minute)
		}
		took := time.Since(start)
		for _, fl := range files {
			fl.Close()
		}
		if err == nil {
			err = f.send([]byte("unmap"), nil)
		}
		if err == nil {
			_, err = f.recv(time.Minute)
		}
		if err != nil {
			return nil, fmt.Errorf("floor, %d bytes: %w", size, err)
		}
		if i > 0 {
			out = append(out, ms(took))
		}
	}
	return out, nil
}

func (f *floorChild) stop() {
	f.send([]byte("quit"), nil)
	select {
	case <-f.done:
	case <-time.After(10 * time.Second):
		f.proc.Kill()
		<-f.done
	}
	f.conn.Close()
}
