package staging

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/gpu"
	"github.com/gdsfs/gdsfs/internal/units"
	"github.com/gdsfs/gdsfs/staging/loader"
)

func TestLoadPathChoice(t *testing.T) {
	data := randomBytes(300000, 11)
	for _, tc := range []struct {
		name      string
		compat    string
		threshold units.Size
		cufile    string // its mode; "": none
		refuse    error
		wantPath  string
		wantNote  string
		wantErr   string
	}{
		{"auto registers", CompatAuto, 0, "gds", nil, PathCuFile, "", ""},
		{"auto, cuFile in compat mode only", CompatAuto, 0, "compat", nil, PathHost, "cuFile runs only in its compat mode", ""},
		{"auto below threshold", CompatAuto, 1 << 20, "gds", nil, PathHost, "smaller than io.gds_threshold", ""},
		{"auto register refused", CompatAuto, 0, "gds", errors.New("cuFileHandleRegister: unsupported file type (5018)"), PathHost, "unsupported file type (5018)", ""},
		{"auto without cufile", CompatAuto, 0, "", nil, PathHost, "cuFile unavailable", ""},
		{"on", CompatOn, 0, "gds", nil, PathHost, "io.compat_mode is on", ""},
		{"off registers", CompatOff, 1 << 20, "compat", nil, PathCuFile, "", ""},
		{"off refused", CompatOff, 0, "gds", errors.New("cuFileHandleRegister: 5027"), "", "", "io.compat_mode is off: cuFileHandleRegister: 5027"},
		{"off without cufile", CompatOff, 0, "", nil, "", "", "io.compat_mode is off and cuFile is unavailable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := t.TempDir()
			needODirect(t, src)
			writeFile(t, src, "f", data)
			d := newFake(1 << 20)
			fc := &fakeCuFile{d: d, refuse: tc.refuse, mode: tc.cufile}
			if tc.cufile != "" {
				d.cufile = fc
			}
			opts, io := testOptions()
			io.CompatMode, io.GDSThreshold = tc.compat, tc.threshold
			c := newCache(t, src, opts, io, d)
			info, err := c.Stage(context.Background(), "f")
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want %q", err, tc.wantErr)
				}
				if state, _ := c.Attr("f"); !strings.HasPrefix(state, "failed: ") || !strings.Contains(state, tc.wantErr) {
					t.Fatalf("state %q does not give the reason", state)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if info.LoadPath != tc.wantPath || !strings.Contains(info.Note, tc.wantNote) {
				t.Fatalf("path %q note %q, want %q and a note with %q", info.LoadPath, info.Note, tc.wantPath, tc.wantNote)
			}
			if tc.wantPath == PathCuFile && fc.reads.Load() == 0 {
				t.Fatal("cuFile path taken without cuFile reads")
			}

			checkStaged(t, c, "f", data)
			s := c.Stats()
			if tc.wantPath == PathCuFile && s.BytesCuFile != uint64(len(data)) || tc.wantPath == PathHost && s.BytesHost != uint64(len(data)) {
				t.Fatalf("bytes not counted on the %s path: %+v", tc.wantPath, s)
			}
			if want := map[bool]uint64{true: uint64(len(data))}[tc.wantPath == PathCuFile]; s.Devices[0].BytesCuFile != want {
				t.Fatalf("device bytes_cufile %d, want %d", s.Devices[0].BytesCuFile, want)
			}
			if tc.compat == CompatAuto && tc.cufile == "compat" && s.CuFileFallbacks != 1 {
				t.Fatalf("fallback not counted: %+v", s)
			}
			if tc.refuse != nil && (s.CuFileFallbacks != 1 || s.CuFileLastError != tc.refuse.Error()) {
				t.Fatalf("fallback not recorded: %+v", s)
			}
		})
	}
}

// needODirect fails the test unless dir's filesystem takes O_DIRECT.
func needODirect(t *testing.T, dir string) {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(dir, ".odirect-probe"), os.O_CREATE|os.O_RDWR|unix.O_DIRECT, 0o600)
	if err != nil {
		t.Fatalf("this test needs O_DIRECT on TMPDIR's filesystem (a disk filesystem or tmpfs >= 6.6): %v", err)
	}
	f.Close()
	os.Remove(f.Name())
}

// dropCache writes rel back and drops it from the page cache, failing the
// test where the filesystem keeps it.
func dropCache(t *testing.T, path string, size int64) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	f.Sync()
	unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
	if share := loader.ResidentShare(f, size); share > 0.1 {
		t.Fatalf("TMPDIR's filesystem keeps the file in the page cache (%.0f%% after FADV_DONTNEED): use a disk filesystem", share*100)
	}
}

// TestDirectIO: with io.direct_io on, the load reads around the page
// cache: a file out of it stays out of it (buffered reads, with the
// read-ahead the loader asks for, would bring it in).
func TestDirectIO(t *testing.T) {
	src := t.TempDir()
	needODirect(t, src)
	data := randomBytes(3*65536+777, 12) // an unaligned tail
	writeFile(t, src, "f", data)
	dropCache(t, filepath.Join(src, "f"), int64(len(data)))
	opts, io := testOptions()
	io.DirectIO = DirectOn
	c := newCache(t, src, opts, io)
	info, err := c.Stage(context.Background(), "f")
	if err != nil {
		t.Fatal(err)
	}
	f, _ := os.Open(filepath.Join(src, "f"))
	defer f.Close()
	if share := loader.ResidentShare(f, int64(len(data))); share > 0.1 || !strings.Contains(info.Note, "read with O_DIRECT") {
		t.Fatalf("after an O_DIRECT load %.0f%% of the file is in the page cache (note %q)", share*100, info.Note)
	}
	checkStaged(t, c, "f", data)
}

// TestCuFileDescriptor: in gds mode cuFile is given an O_DIRECT
// descriptor (GPUDirect Storage proper needs one); in compat mode, one
// where io.direct_io wants O_DIRECT, else the buffered one (its POSIX
// reads then come from the page cache).
func TestCuFileDescriptor(t *testing.T) {
	data := randomBytes(300000, 11)
	for _, tc := range []struct {
		mode, direct string
		wantDirect   bool
	}{
		{"gds", DirectOff, true}, {"gds", DirectOn, true},
		{"compat", DirectOn, true}, {"compat", DirectOff, false},
	} {
		t.Run(tc.mode+"/direct_io="+tc.direct, func(t *testing.T) {
			src := t.TempDir()
			needODirect(t, src)
			writeFile(t, src, "f", data)
			d := newFake(1 << 20)
			fc := &fakeCuFile{d: d, mode: tc.mode}
			d.cufile = fc
			opts, io := testOptions()
			io.DirectIO, io.CompatMode = tc.direct, CompatOff // cuFile even in its compat mode
			c := newCache(t, src, opts, io, d)
			if info, err := c.Stage(context.Background(), "f"); err != nil || info.LoadPath != PathCuFile {
				t.Fatalf("stage: %v %+v", err, info)
			}
			if got := fc.direct.Load() == 1 && fc.plain.Load() == 0; got != tc.wantDirect || fc.direct.Load()+fc.plain.Load() != 1 {
				t.Fatalf("registered %d O_DIRECT and %d buffered descriptors, want O_DIRECT: %v", fc.direct.Load(), fc.plain.Load(), tc.wantDirect)
			}
			checkStaged(t, c, "f", data)
		})
	}
}

// TestCuFileTwinIsTheSameFile: the O_DIRECT descriptor cuFile gets is
// opened again by path; when the path names another file by then, the
// load starts over on the new file rather than registering another inode.
func TestCuFileTwinIsTheSameFile(t *testing.T) {
	src := t.TempDir()
	needODirect(t, src)
	writeFile(t, src, "f", randomBytes(200000, 20))
	fresh := randomBytes(200000, 21)
	d := newFake(1 << 20)
	fc := &fakeCuFile{d: d, mode: "gds"}
	d.cufile = fc
	opts, io := testOptions()
	c := newCache(t, src, opts, io, d)
	var once sync.Once
	c.hooks.directOpen = func(string) {
		once.Do(func() { // replaced between the two opens
			writeFile(t, src, "f.new", fresh)
			os.Rename(filepath.Join(src, "f.new"), filepath.Join(src, "f"))
		})
	}
	info, err := c.Stage(context.Background(), "f")
	if err != nil || info.LoadPath != PathCuFile {
		t.Fatalf("stage: %v (%+v)", err, info)
	}
	checkStaged(t, c, "f", fresh)
	if s := c.Stats(); s.LoadRetries != 1 || fc.direct.Load() != 1 {
		t.Fatalf("retries %d, O_DIRECT registrations %d: want 1 and 1", s.LoadRetries, fc.direct.Load())
	}
}

// TestPrivateCopyFailsWhileClosing: a private copy that fails because the
// cache closed under it frees its own allocation, never the shared region
// (which Close freed).
func TestPrivateCopyFailsWhileClosing(t *testing.T) {
	src := t.TempDir()
	writeFile(t, src, "f", randomBytes(100000, 22))
	d := newFake(1 << 20)
	var regions []*fakeRegion
	var mu sync.Mutex
	d.alloc = func(size int64) (gpu.Region, error) {
		r, err := d.Device.Alloc(size)
		if err != nil {
			return nil, err
		}
		fr := &fakeRegion{Region: r}
		mu.Lock()
		regions = append(regions, fr)
		mu.Unlock()
		return fr, nil
	}
	copying, closed := make(chan struct{}), make(chan struct{})
	d.copy = func(dst, src gpu.Region) error {
		close(copying)
		<-closed
		return errors.New("device gone: the cache closed")
	}
	opts, io := testOptions()
	c, err := New(context.Background(), Config{Source: src, Options: opts, IO: io, Devices: []gpu.Device{d}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Stage(context.Background(), "f"); err != nil {
		t.Fatal(err)
	}
	acquired := make(chan error, 1)
	go func() {
		_, err := c.Acquire(context.Background(), Request{Rel: "f", Private: true})
		acquired <- err
	}()
	<-copying
	c.Close() // frees the shared region under the copy
	close(closed)
	if err := <-acquired; err == nil {
		t.Fatal("a private copy that failed was handed out")
	}
	mu.Lock()
	defer mu.Unlock()
	for i, r := range regions {
		if n := r.frees.Load(); n != 1 {
			t.Errorf("region %d (of %d: shared, then the private copy) freed %d times", i, len(regions), n)
		}
	}
	if s := c.Stats(); s.FreeErrors != 0 {
		t.Errorf("free errors %d", s.FreeErrors)
	}
}

// TestFreeErrorsCounted: a region the device fails to free is logged and
// counted, not forgotten.
func TestFreeErrorsCounted(t *testing.T) {
	src := t.TempDir()
	writeFile(t, src, "f", randomBytes(1000, 23))
	d := newFake(1 << 20)
	d.alloc = func(size int64) (gpu.Region, error) {
		r, err := d.Device.Alloc(size)
		return &fakeRegion{Region: r, freeFail: errors.New("cuMemRelease: CUDA_ERROR_ILLEGAL_STATE")}, err
	}
	opts, io := testOptions()
	c := newCache(t, src, opts, io, d)
	c.Stage(context.Background(), "f")
	if err := c.Evict("f"); err != nil {
		t.Fatal(err)
	}
	if s := c.Stats(); s.FreeErrors != 1 {
		t.Fatalf("free errors %d, want 1", s.FreeErrors)
	}
}

func TestPrivateLease(t *testing.T) {
	src := t.TempDir()
	data := randomBytes(100000, 13)
	writeFile(t, src, "f", data)
	opts, io := testOptions()
	opts.Capacity = capacityFor(2, 100000)
	c := newCache(t, src, opts, io)
	ctx := context.Background()
	shared, err := c.Acquire(ctx, Request{Rel: "f"})
	if err != nil {
		t.Fatal(err)
	}
	defer shared.Release()
	priv, err := c.Acquire(ctx, Request{Rel: "f", Private: true})
	if err != nil {
		t.Fatal(err)
	}
	if priv.Region() == shared.Region() {
		t.Fatal("private lease shares the daemon's region")
	}
	if !bytes.Equal(regionBytes(t, priv.Region()), data) {
		t.Fatal("private copy differs")
	}
	// The capacity holds the file and one copy: a second copy finds no
	// room before its deadline.
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := c.Acquire(short, Request{Rel: "f", Private: true}); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("private copy beyond capacity: %v, want ENOSPC", err)
	}
	used := c.Stats().UsedBytes
	priv.Release()
	if c.Stats().UsedBytes >= used {
		t.Fatal("private copy's space not returned on release")
	}
}

func TestGlobs(t *testing.T) {
	for _, tc := range []struct {
		pattern, path string
		want          bool
	}{
		{"*.bin", "a.bin", true},
		{"*.bin", "x/y/a.bin", true},
		{"*.bin", "a.binx", false},
		{"data/*.bin", "data/a.bin", true},
		{"data/*.bin", "data/x/a.bin", false},
		{"**/*.safetensors", "m.safetensors", true},
		{"**/*.safetensors", "a/b/m.safetensors", true},
		{"shards/**", "shards/a/b", true},
		{"shards/**", "other/a", false},
		{"s[0-9].bin", "s7.bin", true},
		{"s[!0-9].bin", "s7.bin", false},
		{"a?c", "abc", true},
		{"a.c", "abc", false},
	} {
		g, err := compileGlob(tc.pattern)
		if err != nil {
			t.Fatal(err)
		}
		if got := g.match(tc.path); got != tc.want {
			t.Errorf("%q matches %q = %v, want %v", tc.pattern, tc.path, got, tc.want)
		}
	}
	for _, bad := range []string{"", "a[b"} {
		if _, err := compileGlob(bad); err == nil {
			t.Errorf("pattern %q accepted", bad)
		}
	}
	f, _ := newFilter(&Options{Include: []string{"*.bin"}, Exclude: []string{"tmp/**"}})
	for path, want := range map[string]string{"a.bin": "", "tmp/a.bin": "excluded by staging.exclude tmp/**", "a.txt": "not matched by staging.include"} {
		if got := f.why(path); got != want {
			t.Errorf("why(%q) = %q, want %q", path, got, want)
		}
	}
}

// TestDirectIOAuto: auto reads a file in the page cache through it, and a
// file out of it with O_DIRECT.
func TestDirectIOAuto(t *testing.T) {
	src := t.TempDir()
	data := randomBytes(4<<20+100, 14)
	writeFile(t, src, "f", data)
	opts, io := testOptions()
	io.DirectIO = DirectAuto
	c := newCache(t, src, opts, io)
	info, err := c.Stage(context.Background(), "f")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(info.Note, "O_DIRECT") {
		t.Fatalf("a file just written (in the page cache) was read with O_DIRECT: %q", info.Note)
	}
	c.Evict("f")
	f, _ := os.Open(filepath.Join(src, "f"))
	defer f.Close()
	f.Sync()
	unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
	if share := loader.ResidentShare(f, int64(len(data))); share >= 0.5 {
		t.Skipf("SKIPPED the cold half: this filesystem keeps the file cached (%.0f%% resident after FADV_DONTNEED)", share*100)
	}
	info, err = c.Stage(context.Background(), "f")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(info.Note, "O_DIRECT") {
		t.Fatalf("a file out of the page cache was not read with O_DIRECT: %q", info.Note)
	}
	checkStaged(t, c, "f", data)
}
