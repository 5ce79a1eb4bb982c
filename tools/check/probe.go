package check

import (
	"bytes"
	"cmp"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"syscall"

	"go.uber.org/zap"

	"github.com/gdsfs/gdsfs/daemon/config"
	"github.com/gdsfs/gdsfs/gpu"
	"github.com/gdsfs/gdsfs/gpu/cuda"
	"github.com/gdsfs/gdsfs/internal/devices"
)

// probeSize is the file each load path stages in the probes.
const probeSize = 8 << 20

// probes is what staging a file by each path showed.
type probes struct {
	device      string // staging device, as the verdict says it
	kind        string // gpu.KindCUDA or gpu.KindHost; "" when none opened
	posix       string
	posixWorks  bool
	cufile      string // the cuFile read, or why it was not tried
	cufileWorks bool
	cufileMode  string // the device's cuFile mode; "" without cuFile
	cufilePath  string // the path cuFile's own counters say the read took
	register    string
	registered  bool
}

// runProbes opens the staging device staging.device=auto picks and stages
// a new file in dir through the POSIX path and, where the device has
// cuFile, the cuFile path, reading the bytes back each time.
func runProbes(dir string) probes {
	var p probes
	cfg, err := config.Default()
	if err != nil {
		p.device, p.posix, p.cufile, p.register = unknown(err.Error()), unknown(err.Error()), unknown(err.Error()), unknown(err.Error())
		p.cufilePath = unknown(err.Error())
		return p
	}
	devs, err := devices.Open(cfg.Staging, zap.NewNop())
	if err != nil {
		p.device = "unusable: " + err.Error()
		p.posix, p.cufile, p.register = "not tried (no staging device)", "not tried (no staging device)", "not tried (no staging device)"
		p.cufilePath = "not tried (no staging device)"
		return p
	}
	defer devices.Close(devs)
	dev := devs[0]
	p.kind = dev.Kind()
	p.device = describeDevice(dev)
	data := make([]byte, probeSize)
	rand.Read(data)
	f, err := os.CreateTemp(dir, ".gdsfs-check-")
	if err != nil {
		why := "not tried (cannot write a file in " + dir + ": " + err.Error() + ")"
		p.posix, p.cufile, p.register, p.cufilePath = why, why, why, why
		return p
	}
	defer os.Remove(f.Name())
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	f.Close()
	if err != nil {
		why := "not tried (write " + f.Name() + ": " + err.Error() + ")"
		p.posix, p.cufile, p.register, p.cufilePath = why, why, why, why
		return p
	}
	if err := posixProbe(dev, f.Name(), data); err != nil {
		p.posix = "fails: " + err.Error()
	} else {
		p.posix, p.posixWorks = fmt.Sprintf("works (%d MiB read, copied to %s, read back equal)", probeSize>>20, dev.Name()), true
	}
	ordinal := -1
	if len(cfg.Staging.GPUs) > 0 {
		ordinal = cfg.Staging.GPUs[0]
	}
	p.cufileProbe(dev, ordinal, f.Name(), data)
	return p
}

func describeDevice(dev gpu.Device) string {
	if dev.Kind() == gpu.KindHost {
		return "host memory (no GPU answers; see cuda.libcuda)"
	}
	_, total, err := dev.MemInfo()
	if err != nil {
		return "cuda " + dev.Name()
	}
	return fmt.Sprintf("cuda %s (%.1f GiB)", dev.Name(), float64(total)/(1<<30))
}

// posixProbe reads path through a worker's bounce buffers into a region
// and compares what the region holds.
func posixProbe(dev gpu.Device, path string, want []byte) error {
	r, err := dev.Alloc(int64(len(want)))
	if err != nil {
		return err
	}
	defer r.Free()
	w, err := dev.NewWorker(1 << 20)
	if err != nil {
		return err
	}
	defer w.Close()
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	for off, i := 0, 0; off < len(want); i++ {
		b := i & 1
		if err := w.Wait(b); err != nil {
			return err
		}
		n, err := f.ReadAt(w.Buffer(b), int64(off))
		if n == 0 {
			return fmt.Errorf("pread at %d: %v", off, err)
		}
		if err := w.CopyAsync(r, int64(off), b, n); err != nil {
			return err
		}
		off += n
	}
	if err := errors.Join(w.Wait(0), w.Wait(1)); err != nil {
		return err
	}
	return readBack(r, want)
}

// cufileProbe registers path with cuFile and reads it into a region,
// and says from cuFile's own counters which path the read took.
func (p *probes) cufileProbe(dev gpu.Device, ordinal int, path string, want []byte) {
	cf, why := dev.CuFile()
	if cf == nil {
		p.cufile, p.register, p.cufilePath = "not tried ("+why+")", "not tried ("+why+")", "not tried ("+why+")"
		return
	}
	before, why := cuda.CuFileStatistics()
	defer func() {
		if !p.registered {
			p.cufilePath = "not tried (cuFileHandleRegister refused the file)"
			return
		}
		after, awhy := cuda.CuFileStatistics()
		p.cufilePath = readPath(before, after, cmp.Or(why, awhy), dev.Name(), ordinal)
	}()
	p.cufileMode = cf.Mode()
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_DIRECT, 0)
	note := "O_DIRECT"
	if err != nil {
		note = "buffered: O_DIRECT refused"
		if f, err = os.Open(path); err != nil {
			p.cufile, p.register = "fails: "+err.Error(), "not tried ("+err.Error()+")"
			return
		}
	}
	defer f.Close()
	h, err := cf.Register(int(f.Fd()))
	if err != nil {
		p.register = "refused (" + note + "): " + err.Error()
		p.cufile = "fails: cuFileHandleRegister refused a file in the checked directory"
		return
	}
	defer h.Close()
	p.register, p.registered = "registers ("+note+", "+p.cufileMode+" mode)", true
	r, err := dev.Alloc(int64(len(want)))
	if err != nil {
		p.cufile = "fails: " + err.Error()
		return
	}
	defer r.Free()
	for off := 0; off < len(want); {
		n, err := h.ReadInto(r, int64(off), int64(off), min(len(want)-off, 4<<20))
		if err != nil || n <= 0 {
			p.cufile = fmt.Sprintf("fails: cuFileRead at %d: %v", off, err)
			return
		}
		off += n
	}
	if err := readBack(r, want); err != nil {
		p.cufile = "fails: " + err.Error()
		return
	}
	p.cufile, p.cufileWorks = fmt.Sprintf("works (%d MiB read by cuFile in %s mode, read back equal)", probeSize>>20, p.cufileMode), true
}

func readBack(r gpu.Region, want []byte) error {
	got := make([]byte, len(want))
	if _, err := r.ReadAt(got, 0); err != nil {
		return fmt.Errorf("read back: %w", err)
	}
	if !bytes.Equal(got, want) {
		return errors.New("the bytes read back differ from the file")
	}
	return nil
}

// readPath is the cuFile read path verdict from cuFile's counters before
// and after the probe's read, or why there are none to read.
func readPath(before, after cuda.CuFileStats, why, name string, ordinal int) string {
	switch {
	case why != "":
		return unknown("cuFile statistics unavailable: " + why)
	case after.Level < 3:
		return unknown(fmt.Sprintf("cuFile statistics level %d has no per-GPU counters; 3 does", after.Level))
	}
	path := cuda.ReadPath(before, after, name, ordinal)
	if path == "none" {
		return "none (cuFile counted no read on " + name + ")"
	}
	return path
}
