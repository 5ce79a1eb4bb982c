package cuda

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/gdsfs/gdsfs/gpu"
)

// nvidiaFSVersion exists when the nvidia-fs kernel module is loaded; only
// then can cuFile move data by DMA ("gds"). Otherwise it runs its POSIX
// compatibility path ("compat").
var nvidiaFSVersion = "/proc/driver/nvidia-fs/version"

func nvidiaFSPresent() bool {
	_, err := os.Stat(nvidiaFSVersion)
	return err == nil
}

// cufileCandidates lists where libcufile.so.0 is looked for, in order: the
// loader's search path, the CUDA symlink, then every versioned toolkit,
// newest first.
func cufileCandidates() []string {
	target := "x86_64-linux"
	if runtime.GOARCH == "arm64" {
		target = "sbsa-linux"
	}
	out := []string{
		"libcufile.so.0",
		"/usr/local/cuda/targets/" + target + "/lib/libcufile.so.0",
	}
	matches, _ := filepath.Glob("/usr/local/cuda-*/targets/" + target + "/lib/libcufile.so.0")
	slices.SortFunc(matches, func(a, b string) int { return compareVersions(b, a) })
	return append(out, matches...)
}

// cufileSearch is where loadCuFileLib looks (tests point it at a fake).
var cufileSearch = cufileCandidates

// compareVersions orders "/usr/local/cuda-12.9/..." before ".../cuda-13.0/...".
func compareVersions(a, b string) int {
	num := func(p string) []int {
		v, _, _ := strings.Cut(strings.TrimPrefix(p, "/usr/local/cuda-"), "/")
		var out []int
		for _, f := range strings.Split(v, ".") {
			n, _ := strconv.Atoi(f)
			out = append(out, n)
		}
		return out
	}
	return slices.Compare(num(a), num(b))
}

// cufileDriver is the process-wide cuFile driver: cuFileDriverOpen on the
// first user, cuFileDriverClose after the last.
var cufileDriver struct {
	mu      sync.Mutex
	loaded  bool
	loadErr error
	refs    int
}

// acquireCuFile loads libcufile, opens the driver on first use and returns
// the mode, or why cuFile is unavailable. Lock order: cufileDriver.mu, then
// cufileStats.mu.
func acquireCuFile(ctx *cuContext) (mode string, err error) {
	cufileDriver.mu.Lock()
	defer cufileDriver.mu.Unlock()
	if !cufileDriver.loaded {
		cufileDriver.loaded = true
		cufileDriver.loadErr = loadCuFileLib()
	}
	if cufileDriver.loadErr != nil {
		return "", cufileDriver.loadErr
	}
	if cufileDriver.refs == 0 {
		if err := ctx.cufileDriverOpen(); err != nil {
			return "", err
		}
		startCuFileStats()
	}
	cufileDriver.refs++
	if nvidiaFSPresent() {
		return "gds", nil
	}
	return "compat", nil
}

// releaseCuFile drops one user and closes the driver after the last.
func releaseCuFile(ctx *cuContext) error {
	cufileDriver.mu.Lock()
	defer cufileDriver.mu.Unlock()
	if cufileDriver.refs == 0 {
		return nil
	}
	cufileDriver.refs--
	if cufileDriver.refs > 0 {
		return nil
	}
	stopCuFileStats()
	return ctx.cufileDriverClose()
}

var _ gpu.CuFile = (*cuFile)(nil)

// cuFile is a Device's view of the cuFile driver.
type cuFile struct {
	dev  *Device
	mode string
}

// Mode is "gds" or "compat".
func (c *cuFile) Mode() string { return c.mode }

// Register registers fd with cuFileHandleRegister. The error names the
// cuFile status that refused it.
func (c *cuFile) Register(fd int) (gpu.CuFileHandle, error) {
	if err := c.dev.check(); err != nil {
		return nil, err
	}
	h, err := c.dev.ctx.cufileRegister(fd)
	if err != nil {
		return nil, fmt.Errorf("cuda: register fd %d: %w", fd, err)
	}
	return &cuFileHandle{cf: c, h: h}, nil
}

var _ gpu.CuFileHandle = (*cuFileHandle)(nil)

// cuFileHandle is a registered file.
type cuFileHandle struct {
	cf *cuFile
	h  cufileHandle

	mu     sync.RWMutex // shared by reads, exclusive in Close
	closed bool
}

// ReadInto reads n bytes at fileOff into dst at dstOff with cuFileRead and
// returns the bytes read, fewer only at end of file. A read that crosses
// chunks is split at chunk boundaries, and each piece passes its chunk's
// base address with the offset inside it, because each chunk is a separate
// allocation (and, in gds mode, a separately registered buffer).
func (h *cuFileHandle) ReadInto(dst gpu.Region, dstOff, fileOff int64, n int) (int, error) {
	r, err := h.cf.dev.own(dst)
	if err != nil {
		return 0, fmt.Errorf("cuda: cufile read: %w", err)
	}
	if n < 0 || dstOff < 0 || fileOff < 0 || dstOff > r.size-int64(n) {
		return 0, fmt.Errorf("cuda: cufile read: %d bytes at %d fall outside a %d byte region", n, dstOff, r.size)
	}
	h.mu.RLock()
	defer h.mu.RUnlock()
	if h.closed {
		return 0, errClosed
	}
	if err := r.rlock(); err != nil {
		return 0, err
	}
	defer r.mu.RUnlock()
	if h.cf.mode == "gds" {
		if err := r.registerCuFile(); err != nil {
			return 0, err
		}
	}
	done := 0
	for done < n {
		base, inner, room := r.chunkAt(dstOff + int64(done))
		want := int(min(int64(n-done), room))
		got, err := h.cf.dev.ctx.cufileRead(h.h, base, want, fileOff+int64(done), inner)
		if err != nil {
			return done, fmt.Errorf("cuda: cufile read %d bytes at file offset %d: %w", want, fileOff+int64(done), err)
		}
		done += got
		if got < want {
			break // end of file
		}
	}
	return done, nil
}

// Close deregisters the file; the descriptor stays open.
func (h *cuFileHandle) Close() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil
	}
	h.closed = true
	h.cf.dev.ctx.cufileDeregister(h.h)
	return nil
}

// chunkAt returns the chunk holding region offset off: its base address,
// off's offset inside it, and the bytes left in it from there.
func (r *Region) chunkAt(off int64) (base uint64, inner, room int64) {
	start := int64(0)
	for _, c := range r.chunks {
		if off < start+c {
			return r.base + uint64(start), off - start, start + c - off
		}
		start += c
	}
	return r.base + uint64(r.total), 0, 0
}

// registerCuFile registers every chunk with cuFileBufRegister the first time
// the region is read into in gds mode. Called with r.mu held shared.
func (r *Region) registerCuFile() error {
	r.regMu.Lock()
	defer r.regMu.Unlock()
	if r.registered {
		return nil
	}
	var done []uint64
	var err error
	r.forEachChunk(func(base uint64, n int64) {
		if err != nil {
			return
		}
		if err = r.dev.ctx.cufileBufRegister(base, n); err == nil {
			done = append(done, base)
		}
	})
	if err != nil {
		var errs []error
		for _, b := range done {
			errs = append(errs, r.dev.ctx.cufileBufDeregister(b))
		}
		return fmt.Errorf("cuda: cufile register buffer: %w", errors.Join(append([]error{err}, errs...)...))
	}
	r.registered = true
	return nil
}
