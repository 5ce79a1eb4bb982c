package loader

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/gpu"
	"github.com/gdsfs/gdsfs/internal/units"
)

// Load paths, as counted in bytes_cufile, bytes_posix and bytes_host.
const (
	PathCuFile = "cufile"
	PathPOSIX  = "posix"
	PathHost   = "host"
	// PathPeer: copied device to device from a replica on another device.
	PathPeer = "peer"
)

// io.compat_mode values.
const (
	CompatAuto = "auto"
	CompatOn   = "on"
	CompatOff  = "off"
)

// io.direct_io values.
const (
	DirectAuto = "auto" // O_DIRECT when most of the file is not in the page cache
	DirectOn   = "on"
	DirectOff  = "off" // buffered reads, as a plain reader's
)

// ErrChanged is wrapped by a load that saw its file change under it (a
// shorter file, another inode behind the path).
var ErrChanged = fmt.Errorf("changed while it was loading: %w", syscall.EAGAIN)

// Options is the io section resolved: no auto values left.
type Options struct {
	NumThreads   int
	BounceSize   int
	TaskSize     int64
	CompatMode   string // CompatAuto, CompatOn, CompatOff
	GDSThreshold int64
	DirectIO     string // DirectAuto, DirectOn, DirectOff
}

// Hooks let tests see points that are not results. Each may be nil.
type Hooks struct {
	Queued func(rel string, low bool) // a load's tasks were queued for the workers
}

// Background is what a load carries beyond a demand load: its
// cancellation and its priority.
type Background struct {
	Ctx    context.Context // ends the load early
	Cancel context.CancelFunc
	// Low: its tasks yield to demand tasks; cleared when a demand joins
	// it (call Loader.Signal after clearing it).
	Low atomic.Bool
	// Gentle: a staging after a plain read, at most gentleTasks tasks in
	// flight (with every gentle load on the loader) while Low.
	Gentle bool
}

// Request is one load.
type Request struct {
	Rel    string   // for hooks, errors and logs
	File   *os.File // the file, opened buffered
	Size   int64    // its size
	Span   Span     // the bytes to read; Region's offsets are the file's
	Region gpu.Region
	// OpenDirect opens the file again with O_DIRECT; it wraps ErrChanged
	// when the path names another file now.
	OpenDirect func() (*os.File, error)
	Background *Background // nil: a demand load
}

// Result is what a load did.
type Result struct {
	Path string // PathCuFile, PathPOSIX or PathHost
	// Note: why the path is not cuFile although cuFile exists, and how
	// the file was read (O_DIRECT or not).
	Note string
	// CuFileFallback: cuFile was available but the POSIX path ran;
	// CuFileError is cuFile's refusal to register the file, if that was
	// why.
	CuFileFallback bool
	CuFileError    string
}

// Span is a byte range of a file: [Off, End).
type Span struct{ Off, End int64 }

// Load reads req.Span of the file into req.Region by the path the options
// and the platform allow.
func (l *Loader) Load(req Request) (Result, error) {
	var res Result
	posix := PathPOSIX
	if l.dev.Kind() == gpu.KindHost {
		posix = PathHost
	}
	cf, why := l.dev.CuFile()
	switch {
	case l.opts.CompatMode == CompatOn:
		res.Note = "io.compat_mode is on"
	case cf == nil && l.opts.CompatMode == CompatOff:
		res.Path = PathCuFile
		return res, fmt.Errorf("io.compat_mode is off and cuFile is unavailable: %s", why)
	case cf == nil:
		res.Note = "cuFile unavailable: " + why
	case l.opts.CompatMode == CompatAuto && req.Size < l.opts.GDSThreshold:
		res.Note = fmt.Sprintf("smaller than io.gds_threshold (%s)", units.Size(l.opts.GDSThreshold))
	case l.opts.CompatMode == CompatAuto && cf.Mode() != "gds":
		// cuFile's compat mode is POSIX reads through its own bounce
		// buffers, slower than the POSIX path's pinned bounce buffers
		// (`gdsfs bench loader` shows both). Without GPUDirect Storage
		// proper, the POSIX path.
		res.CuFileFallback = true
		res.Note = "cuFile runs only in its compat mode here (no GPUDirect Storage: nvidia-fs not in use); the POSIX path is faster"
	default:
		done, err := l.loadCuFile(req, cf, &res)
		if done || err != nil {
			res.Path = PathCuFile
			return res, err
		}
	}
	res.Path = posix
	j := &job{rel: req.Rel, region: req.Region, start: req.Span.Off, size: req.Span.End, f: req.File, bg: req.Background}
	if l.wantDirect(req.File, req.Size) {
		df, derr := req.OpenDirect()
		switch {
		case errors.Is(derr, ErrChanged):
			return res, derr
		case derr == nil:
			defer df.Close()
			j.f, j.direct = df, true
			res.Note = JoinNote(res.Note, "read with O_DIRECT")
		default:
			res.Note = JoinNote(res.Note, "O_DIRECT refused, buffered reads: "+derr.Error())
		}
	}
	if !j.direct {
		// Parallel tasks on one descriptor defeat the kernel's sequential
		// read-ahead; this starts a read-ahead at the span's start. The
		// kernel caps it at the device's read-ahead window
		// (force_page_cache_ra: max of io_pages and ra_pages), so it does
		// not read the whole span ahead.
		unix.Fadvise(int(req.File.Fd()), req.Span.Off, req.Span.End-req.Span.Off, unix.FADV_WILLNEED)
	}
	return res, l.run(j)
}

// loadCuFile loads with cuFile when it registers the file. In gds mode
// cuFile gets an O_DIRECT descriptor (GPUDirect Storage proper reads only
// through one; KvikIO's FileHandle keeps the same pair), checked to name
// the inode the buffered one names. In compat mode cuFile reads with POSIX
// calls on the descriptor it is given, so it gets the O_DIRECT one where
// io.direct_io wants O_DIRECT (on, or auto and the file mostly out of the
// page cache) and the buffered one otherwise, as KvikIO's compat mode
// reads through the page cache. Where the filesystem refuses O_DIRECT, the
// buffered one. done is false when registration was refused and the POSIX
// path should run; res.Note then says why.
func (l *Loader) loadCuFile(req Request, cf gpu.CuFile, res *Result) (done bool, err error) {
	reg := req.File
	if cf.Mode() == "gds" || l.wantDirect(req.File, req.Size) {
		df, derr := req.OpenDirect()
		switch {
		case errors.Is(derr, ErrChanged):
			return true, derr
		case derr == nil:
			defer df.Close()
			reg = df
			res.Note = "read with O_DIRECT"
		default:
			res.Note = "O_DIRECT refused, cuFile given the buffered descriptor: " + derr.Error()
		}
	}
	h, rerr := cf.Register(int(reg.Fd()))
	if rerr == nil {
		defer h.Close()
		return true, l.run(&job{rel: req.Rel, region: req.Region, start: req.Span.Off, size: req.Span.End, cf: h, bg: req.Background})
	}
	if l.opts.CompatMode == CompatOff {
		res.Note = ""
		return true, fmt.Errorf("io.compat_mode is off: %w", rerr)
	}
	res.CuFileFallback, res.CuFileError = true, rerr.Error()
	res.Note = rerr.Error()
	return false, nil
}

// wantDirect says whether to read with O_DIRECT: io.direct_io on, or auto
// and most of a sample of the file's pages are not in the page cache (cold
// data: reading it through the cache would only evict others).
func (l *Loader) wantDirect(f *os.File, size int64) bool {
	switch l.opts.DirectIO {
	case DirectOn:
		return true
	case DirectOff:
		return false
	}
	return size >= 1<<20 && ResidentShare(f, size) < 0.5
}

// ResidentShare samples 64 pages of f with mincore and returns the share
// found in the page cache (1 when it cannot tell).
func ResidentShare(f *os.File, size int64) float64 {
	m, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return 1
	}
	defer unix.Munmap(m)
	const samples = 64
	page := int64(os.Getpagesize())
	vec := make([]byte, 1)
	in := 0
	for k := int64(0); k < samples; k++ {
		off := (size - 1) * k / (samples - 1) / page * page
		_, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[off])), 1, uintptr(unsafe.Pointer(&vec[0])))
		if errno == 0 && vec[0]&1 != 0 {
			in++
		}
	}
	return float64(in) / samples
}

// JoinNote joins two notes with "; ", either may be empty.
func JoinNote(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}
