package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/proto"
)

// mountBench is one run of `gdsfs bench mount`: its directory and files.
type mountBench struct {
	opts     MountOptions
	self     string // this binary, run as the gdsfs daemon
	dir      string // absolute
	source   string // dir/source
	removeAt bool   // dir was made here and goes at the end
	leftover bool   // a mount could not be removed cleanly: keep dir
	names    []string
	subjects []*subject // in table order; native first
}

func newMountBench(o MountOptions) (*mountBench, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find this binary to run it as the gdsfs daemon: %w", err)
	}
	b := &mountBench{opts: o, self: self, dir: o.Dir}
	if b.dir == "" {
		if b.dir, err = os.MkdirTemp("/var/tmp", "gdsfs-bench-mount-"); err != nil {
			return nil, fmt.Errorf("work directory: %w", err)
		}
		b.removeAt = true
	} else if b.dir, err = filepath.Abs(b.dir); err != nil {
		return nil, fmt.Errorf("--dir %s: %w", o.Dir, err)
	} else if err = openWorkDir("--dir", b.dir); err != nil {
		return nil, err
	}
	b.source = filepath.Join(b.dir, "source")
	for i := range o.Files {
		b.names = append(b.names, fmt.Sprintf("f%06d", i))
	}
	return b, nil
}

func (b *mountBench) bigPath() string              { return filepath.Join(b.source, bigName) }
func (b *mountBench) mountpoint(key string) string { return filepath.Join(b.dir, "mnt-"+key) }

func (b *mountBench) say(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "gdsfs bench mount: "+format+"\n", args...)
}

// cleanup removes the work directory it made, unless a mount may remain
// inside it.
func (b *mountBench) cleanup() {
	switch {
	case !b.removeAt:
	case b.leftover:
		b.say("left %s in place: a mount in it may not have gone cleanly", b.dir)
	default:
		if err := os.RemoveAll(b.dir); err != nil {
			b.say("remove %s: %v", b.dir, err)
		}
	}
}

// prepare writes SOURCE: the big file of random bytes and the small files,
// then syncs so writeback does not run during the timed passes.
func (b *mountBench) prepare(ctx context.Context) error {
	many := filepath.Join(b.source, manyDir)
	if err := os.MkdirAll(many, 0o755); err != nil {
		return fmt.Errorf("prepare SOURCE: %w", err)
	}
	rng := rand.NewChaCha8([32]byte{'g', 'd', 's', 'f', 's'})
	if err := writeFile(b.bigPath(), io.LimitReader(rng, int64(b.opts.Size))); err != nil {
		return err
	}
	buf := make([]byte, smallSize)
	for i, name := range b.names {
		if i%1024 == 0 && ctx.Err() != nil {
			return ctx.Err()
		}
		rng.Read(buf)
		if err := writeNew(filepath.Join(many, name), buf, 0o644); err != nil {
			return fmt.Errorf("prepare SOURCE: %w", err)
		}
	}
	unix.Sync()
	return nil
}

func writeFile(path string, r io.Reader) error {
	f, err := createFile(path, 0o644)
	if err != nil {
		return fmt.Errorf("prepare SOURCE: %w", err)
	}
	_, err = io.CopyBuffer(f, r, make([]byte, readBlock))
	if err == nil {
		err = f.Sync()
	}
	if err == nil {
		// Pages left by write() read at half the speed of those read
		// ahead (smaller folios); drop them so every row reads the file
		// as cached by a read.
		err = unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("prepare SOURCE: write %s: %w", path, err)
	}
	return nil
}

// warmUpAll reads the big file once through every mount, untimed, and
// checks that each gdsfs mount uses passthrough exactly when asked.
func (b *mountBench) warmUpAll(ctx context.Context) error {
	for _, s := range b.active() {
		if s.d == nil {
			continue
		}
		if s.fs.gdsfs {
			if err := checkPassthrough(s); err != nil {
				return err
			}
			if s.row.Unavailable != "" {
				continue
			}
		}
		if _, err := readPass(filepath.Join(s.root, bigName), make([]byte, readBlock), int64(b.opts.Size)); err != nil {
			return fmt.Errorf("%s: warm-up read: %w", s.fs.name, err)
		}
	}
	// On gdsfs that open stages the file in the background; the timed
	// passes are to see steady state.
	for _, s := range b.active() {
		if s.fs.gdsfs {
			if err := b.waitStaged(ctx, s); err != nil {
				return err
			}
		}
	}
	return nil
}

// waitStaged waits on the lease socket until gdsfs's staging cache has
// the big file resident (or failed). One that never gets there is a
// note, not an error.
func (b *mountBench) waitStaged(ctx context.Context, s *subject) error {
	// Staging reads at disk or page-cache speed; allow for a slow disk.
	limit := max(time.Minute, time.Duration(b.opts.Size/(50<<20))*time.Second)
	state, err := stagedState(ctx, s, limit)
	switch {
	case ctx.Err() != nil:
		return ctx.Err()
	case err != nil && (state == "" || state == proto.StateAbsent):
		s.row.Notes = append(s.row.Notes, fmt.Sprintf("staging: %s never listed in .gdsfs/cache (%v)", bigName, err))
	case err != nil:
		s.row.Notes = append(s.row.Notes, fmt.Sprintf("staging: %s still %s (%v)", bigName, state, err))
	case state != proto.StateResident:
		s.row.Notes = append(s.row.Notes, "staging: "+state)
	}
	return nil
}

// stagedState waits up to limit for the big file to be resident or
// failed; past limit it is the state then, with an error.
func stagedState(ctx context.Context, s *subject, limit time.Duration) (string, error) {
	w, err := dialWaiter(s.fs.socket, s.d.exited)
	if err != nil {
		return "", err
	}
	defer w.close()
	state, err := w.state(ctx, bigName, []string{proto.StateResident, proto.StateFailed}, time.Now().Add(limit))
	if !timedOut(err) {
		return state, err
	}
	state, err = w.stat(ctx, bigName)
	if err != nil {
		return "", err
	}
	return state, fmt.Errorf("not done after %v", limit)
}

// measureReads reads the big file natively once (so SOURCE's page cache
// is warm), then runs --runs rounds of one timed pass per filesystem,
// each pass a fresh open and 1 MiB reads to the end. It counts the reads
// each daemon served meanwhile.
func (b *mountBench) measureReads(ctx context.Context) error {
	b.say("timing reads")
	buf := make([]byte, readBlock)
	size := int64(b.opts.Size)
	if _, err := readPass(b.bigPath(), buf, size); err != nil {
		return fmt.Errorf("warm the page cache: %w", err)
	}
	subjects := b.active()
	before := make([]uint64, len(subjects))
	for i, s := range subjects {
		var err error
		if before[i], err = s.readCount(); err != nil {
			return err
		}
	}
	err := rounds(ctx, b.opts.Runs, subjects, func(s *subject) error {
		d, err := readPass(filepath.Join(s.root, bigName), buf, size)
		if err != nil {
			return fmt.Errorf("%s: %w", s.fs.name, err)
		}
		s.row.ReadRunsGBps = append(s.row.ReadRunsGBps, float64(size)/d.Seconds()/1e9)
		return nil
	})
	if err != nil {
		return err
	}
	for i, s := range subjects {
		after, err := s.readCount()
		if err != nil {
			return err
		}
		s.row.ReadGBps = bestOf(s.row.ReadRunsGBps)
		s.row.DaemonReads = after - before[i]
		b.judgePassthrough(s)
	}
	return nil
}

// rounds runs pass on every subject, runs times, starting each round
// one subject further so none always goes first.
func rounds(ctx context.Context, runs int, subjects []*subject, pass func(*subject) error) error {
	for r := range runs {
		for i := range subjects {
			if err := ctx.Err(); err != nil {
				return err
			}
			if err := pass(subjects[(r+i)%len(subjects)]); err != nil {
				return err
			}
		}
	}
	return nil
}

// readCount is how many reads s's daemon has served (0 for native).
func (s *subject) readCount() (uint64, error) {
	if s.d == nil {
		return 0, nil
	}
	n, err := s.d.readCount(s.fs.gdsfs)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", s.fs.name, err)
	}
	return n, nil
}

// readPass opens path, reads it to the end in len(buf) reads, closes it
// and returns the time taken.
func readPass(path string, buf []byte, want int64) (time.Duration, error) {
	start := time.Now()
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	var n int64
	for {
		m, rerr := f.Read(buf)
		n += int64(m)
		if errors.Is(rerr, io.EOF) {
			break
		}
		if rerr != nil {
			f.Close()
			return 0, rerr
		}
	}
	if err := f.Close(); err != nil {
		return 0, err
	}
	elapsed := time.Since(start)
	if n != want {
		return 0, fmt.Errorf("read %s: %d bytes, want %d", path, n, want)
	}
	return elapsed, nil
}

// measureStats times --runs rounds of one lstat pass per filesystem over
// every small file. Before each pass the dentry and inode caches are
// dropped (so a FUSE mount's lookups reach its daemon) and SOURCE is
// walked natively once, untimed, so the daemon's own lookups hit warm
// dentries. For SOURCE itself the timed pass is thus the second native
// pass.
func (b *mountBench) measureStats(ctx context.Context) error {
	b.say("timing lstat")
	native := joinAll(filepath.Join(b.source, manyDir), b.names)
	subjects := b.active()
	paths := make(map[*subject][]string, len(subjects))
	for _, s := range subjects {
		paths[s] = joinAll(filepath.Join(s.root, manyDir), b.names)
	}
	err := rounds(ctx, b.opts.Runs, subjects, func(s *subject) error {
		if err := dropDentries(); err != nil {
			return err
		}
		if _, err := statPass(ctx, native); err != nil {
			return err
		}
		d, err := statPass(ctx, paths[s])
		if err != nil {
			return fmt.Errorf("%s: %w", s.fs.name, err)
		}
		s.row.StatRuns = append(s.row.StatRuns, float64(len(b.names))/d.Seconds())
		return nil
	})
	if err != nil {
		return err
	}
	for _, s := range subjects {
		s.row.StatPerSec = median(s.row.StatRuns)
	}
	return nil
}

func joinAll(dir string, names []string) []string {
	paths := make([]string, len(names))
	for i, n := range names {
		paths[i] = filepath.Join(dir, n)
	}
	return paths
}

func statPass(ctx context.Context, paths []string) (time.Duration, error) {
	start := time.Now()
	for i, p := range paths {
		if i%1024 == 0 && ctx.Err() != nil {
			return 0, ctx.Err()
		}
		if _, err := os.Lstat(p); err != nil {
			return 0, err
		}
	}
	return time.Since(start), nil
}

// dropDentries drops the kernel's dentry and inode caches.
func dropDentries() error {
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("2"), 0); err != nil {
		return fmt.Errorf("drop dentries and inodes: %w", err)
	}
	return nil
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return s[len(s)/2]
}

func bestOf(v []float64) float64 {
	best := 0.0
	for _, x := range v {
		best = max(best, x)
	}
	return best
}

// checkPassthrough confirms from stats.json that a gdsfs mount uses
// passthrough exactly when asked. Where passthrough was asked for and the
// daemon went without, the row is marked unavailable.
func checkPassthrough(s *subject) error {
	st, err := readStats(s.root)
	if err != nil {
		return fmt.Errorf("%s: %w", s.fs.name, err)
	}
	s.row.Passthrough = &st.Passthrough
	switch {
	case s.fs.passthrough && !st.Passthrough:
		s.row.Unavailable = "the daemon reports no passthrough: " + st.PassthroughReason
	case !s.fs.passthrough && st.Passthrough:
		return fmt.Errorf("%s: stats.json says passthrough is on with fuse.passthrough=off", s.fs.name)
	}
	return nil
}

// judgePassthrough sets, for the loopback, whether the kernel read through
// passthrough: without it every pass costs at least one daemon read per
// MiB, with it only the few reads of open, flush and release.
func (b *mountBench) judgePassthrough(s *subject) {
	if s.d == nil {
		return
	}
	perPass := s.row.DaemonReads / uint64(b.opts.Runs)
	if s.fs.gdsfs {
		if s.fs.passthrough && perPass > 0 {
			s.row.Notes = append(s.row.Notes, fmt.Sprintf("the daemon served %d reads per pass despite passthrough", perPass))
		}
		return
	}
	pt := perPass < 8+uint64(b.opts.Size)/(2<<20)
	s.row.Passthrough = &pt
}
