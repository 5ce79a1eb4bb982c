package bench

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/internal/control"
	"github.com/gdsfs/gdsfs/internal/mountinfo"
	"github.com/gdsfs/gdsfs/proto"
)

// makeFile makes path with size pseudo-random bytes (seeded by its name,
// so a rerun makes the same file), unless it is already there with that
// size. It returns the file's SHA-256 when hash is set.
func makeFile(path string, size int64, hash bool) (string, error) {
	if st, err := os.Stat(path); err == nil && st.Size() == size {
		if !hash {
			return "", nil
		}
		return sha256File(path)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return "", err
	}
	var seed [32]byte
	copy(seed[:], filepath.Base(path))
	h := sha256.New()
	f, err := createFile(path, 0o644)
	if err != nil {
		return "", err
	}
	err = fill(io.MultiWriter(f, h), rand.NewChaCha8(seed), size)
	if err == nil {
		err = f.Sync()
	}
	if err = joinClose(err, f); err != nil {
		os.Remove(path)
		return "", fmt.Errorf("make %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// fill writes n bytes of r to w in 8 MiB writes.
func fill(w io.Writer, r io.Reader, n int64) error {
	buf := make([]byte, 8<<20)
	for n > 0 {
		b := buf[:min(int64(len(buf)), n)]
		if _, err := io.ReadFull(r, b); err != nil {
			return err
		}
		if _, err := w.Write(b); err != nil {
			return err
		}
		n -= int64(len(b))
	}
	return nil
}

func sha256File(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// makeSet makes n files of size named PREFIX-NNNN.bin in dir and returns
// their paths relative to base.
func makeSet(base, dir, prefix string, n int, size int64) ([]string, error) {
	var rels []string
	for i := range n {
		rel := filepath.Join(dir, fmt.Sprintf("%s-%04d.bin", prefix, i))
		if _, err := makeFile(filepath.Join(base, rel), size, false); err != nil {
			return nil, err
		}
		rels = append(rels, rel)
	}
	return rels, nil
}

// benchMount is a gdsfs daemon this bench started (self-exec) over src.
type benchMount struct {
	name, src, mnt string
	socket         string // its lease socket
	d              *daemon
}

// startMount mounts src on dir/NAME.mnt with sets, its socket and log in dir.
func startMount(ctx context.Context, dir, name, src string, sets []string) (*benchMount, error) {
	mnt := filepath.Join(dir, name+".mnt")
	if _, ok := mountinfo.MountedAt(mnt); ok { // left by an interrupted run
		unix.Unmount(mnt, unix.MNT_DETACH)
	}
	if err := os.MkdirAll(mnt, 0o755); err != nil {
		return nil, err
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	socket := filepath.Join(dir, name+".sock")
	argv := []string{exe, "mount", "--set", "ipc.socket=" + socket}
	for _, s := range sets {
		argv = append(argv, "--set", s)
	}
	argv = append(argv, src, mnt)
	d, err := startDaemon(ctx, "gdsfs ("+name+")", mnt, filepath.Join(dir, name+".log"), argv, readiness{notify: true})
	if err != nil {
		return nil, err
	}
	return &benchMount{name: name, src: src, mnt: mnt, socket: socket, d: d}, nil
}

func (m *benchMount) stop() error { return m.d.stop() }

func (m *benchMount) path(rel string) string { return filepath.Join(m.mnt, rel) }

// waiter is a connection to the mount's lease socket for waiting on it.
func (m *benchMount) waiter() (*waiter, error) { return dialWaiter(m.socket, m.d.exited) }

// controlFile opens .gdsfs/NAME for writing, one line per write: a
// write's error is that line's (EAGAIN: the prefetch queue is full; see
// control.OpenWriter for why not os.OpenFile).
func (m *benchMount) controlFile(name string) (*os.File, error) {
	return control.OpenWriter(filepath.Join(m.mnt, ".gdsfs", name))
}

// stageTries bounds how often stageAll asks for one file.
const stageTries = 3

// stageAll prefetches rels through .gdsfs/prefetch and waits on the
// lease socket until each is resident. A file the prefetch queue drops
// (full: EAGAIN) is asked for again once the oldest file asked before it
// is settled. One that reads absent after it was asked (dropped before
// its load, or evicted since) is asked for again, up to stageTries times
// in all; a failed one is an error.
func (m *benchMount) stageAll(ctx context.Context, rels []string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	w, err := m.waiter()
	if err != nil {
		return fmt.Errorf("stage %d files on %s: %w", len(rels), m.mnt, err)
	}
	defer w.close()
	pf, err := m.controlFile("prefetch")
	if err != nil {
		return fmt.Errorf("stage %d files on %s: %w", len(rels), m.mnt, err)
	}
	defer pf.Close()
	todo := append([]string{}, rels...)
	var asked []string // in the queue or staged: settled oldest first
	tries := map[string]int{}
	resident := 0
	fail := func(err error) error {
		return fmt.Errorf("stage %d files on %s (%d not resident): %w", len(rels), m.mnt, len(rels)-resident, err)
	}
	for len(todo) > 0 || len(asked) > 0 {
		if len(todo) > 0 {
			_, err := pf.WriteString(todo[0] + "\n")
			switch {
			case err == nil:
				tries[todo[0]]++
				asked, todo = append(asked, todo[0]), todo[1:]
				continue
			case !errors.Is(err, unix.EAGAIN):
				return fail(fmt.Errorf("prefetch: %w", err))
			case len(asked) == 0:
				return fail(fmt.Errorf("prefetch %s: the queue is full of files this bench did not ask for", todo[0]))
			}
		}
		rel := asked[0]
		asked = asked[1:]
		state, err := w.state(ctx, rel, []string{proto.StateResident, proto.StateFailed, proto.StateAbsent}, deadline)
		switch {
		case timedOut(err):
			return fail(fmt.Errorf("not done after %v", limit))
		case err != nil:
			return fail(err)
		case state == proto.StateResident:
			resident++
		case isFailed(state):
			return fail(fmt.Errorf("%s: %s", rel, state))
		case tries[rel] >= stageTries:
			return fail(fmt.Errorf("%s: still %s after %d prefetches", rel, state, tries[rel]))
		default:
			todo = append(todo, rel)
		}
	}
	return nil
}

// stats is .gdsfs/stats.json.
func (m *benchMount) stats() (map[string]any, error) {
	b, err := os.ReadFile(filepath.Join(m.mnt, ".gdsfs", "stats.json"))
	if err != nil {
		return nil, fmt.Errorf("read stats: %w", err)
	}
	var st map[string]any
	return st, json.Unmarshal(b, &st)
}

// device is the device the mount stages on ("host" or "GPU-...").
func (m *benchMount) device() (string, error) {
	st, err := m.stats()
	if err != nil {
		return "", err
	}
	d, _ := st["device"].(string)
	return d, nil
}

func statInt(st map[string]any, key string) int64 {
	f, _ := st[key].(float64)
	return int64(f)
}

// procUsage is a process's resident memory and open descriptors, the
// latter by what they name (fdKind).
type procUsage struct {
	RSSBytes int64          `json:"rss_bytes"`
	FDs      int            `json:"fds"`
	FDKinds  map[string]int `json:"fd_kinds,omitempty"`
}

func usageOf(pid int) (procUsage, error) {
	u := procUsage{FDKinds: map[string]int{}}
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	fds, err := os.ReadDir(dir)
	if err != nil {
		return u, err
	}
	u.FDs = len(fds)
	for _, fd := range fds {
		if target, err := os.Readlink(filepath.Join(dir, fd.Name())); err == nil { // gone meanwhile: not counted by kind
			u.FDKinds[fdKind(target)]++
		}
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return u, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				return u, fmt.Errorf("VmRSS %q: %w", v, err)
			}
			u.RSSBytes = kb << 10
		}
	}
	return u, nil
}

// fdKind is what a descriptor names, without what differs per instance:
// "socket", "pipe", "anon_inode:[eventfd]", "/dev/nvidia0", a path.
func fdKind(target string) string {
	for _, p := range []string{"socket:", "pipe:", "net:"} {
		if strings.HasPrefix(target, p) {
			return strings.TrimSuffix(p, ":")
		}
	}
	return target
}

// fdKindsGrown says which kinds of descriptors after has more of than
// before: "socket +2, /dev/nvidia-uvm +1".
func fdKindsGrown(before, after map[string]int) string {
	var out []string
	for k, n := range after {
		if d := n - before[k]; d > 0 {
			out = append(out, fmt.Sprintf("%s +%d", k, d))
		}
	}
	sort.Strings(out)
	return strings.Join(out, ", ")
}

// warmPageCache reads path once so later reads of it come from memory.
func warmPageCache(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(io.Discard, f)
	return err
}
