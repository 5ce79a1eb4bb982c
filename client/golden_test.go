package client

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/internal/testkit/golden"
	"github.com/gdsfs/gdsfs/proto"
)

// TestGoldenTranscripts replays proto/testdata against this client: a
// fake daemon follows each transcript, checks that the client's requests
// are the transcript's, byte for byte once parsed, and answers with the
// transcript's answers and memfds of the files; the client's leases must
// then hold the files' bytes. The server's tests replay the same files
// against the real daemon, and the Python client's tests against theirs.
func TestGoldenTranscripts(t *testing.T) {
	ts, err := golden.Load("../proto/testdata")
	if err != nil {
		t.Fatal(err)
	}
	for _, tr := range ts {
		t.Run(tr.Name, func(t *testing.T) { replayClient(t, tr) })
	}
}

// fakeDaemon plays a transcript's daemon side.
type fakeDaemon struct {
	t     *testing.T
	tr    golden.Transcript
	root  string // a gdsfs mount to the client (MountinfoForTest); it sends paths relative to it
	ln    *net.UnixListener
	mu    sync.Mutex // guards files: the client side checks leases against it
	files map[string][]byte
	b     golden.Bindings
	next  int64
	done  chan error
}

func replayClient(t *testing.T, tr golden.Transcript) {
	dir := t.TempDir()
	root, _ := filepath.EvalSymlinks(dir)
	sock := filepath.Join(root, "fake.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	t.Setenv("GDSFS_SOCKET", sock)
	t.Cleanup(MountinfoForTest(fakeMount(root)))
	t.Setenv("GDSFS_DEVICE", "none") // transcripts name devices explicitly
	DropCache()
	defer DropCache()
	d := &fakeDaemon{t: t, tr: tr, root: root, ln: ln, files: map[string][]byte{}, b: golden.Bindings{}, next: 100, done: make(chan error, 1)}
	for rel, f := range tr.Setup.Files {
		d.files[rel] = golden.Content(f.Seed, f.Size)
	}
	go func() { d.done <- d.serve() }()
	leases := map[string]*Lease{}
	for _, st := range tr.Steps {
		if st.Client == "" || st.ServerOnly {
			continue
		}
		where := fmt.Sprintf("%s.jsonl:%d %q", tr.Name, st.Line, st.Client)
		if err := d.call(st, leases); err != nil {
			t.Errorf("%s: %v", where, err)
		}
	}
	for _, l := range leases {
		l.Close()
	}
	DropCache()
	select {
	case err := <-d.done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the fake daemon did not reach the transcript's end: the client sent fewer requests")
	}
}

// call makes one client call of a transcript.
func (d *fakeDaemon) call(st golden.Step, leases map[string]*Lease) error {
	f := strings.Fields(st.Client)
	abs := func(p string) string { return filepath.Join(d.root, p) }
	var opts []LeaseOption
	key := func(p string) string { return p }
	if dev, ok := strings.CutPrefix(f[len(f)-1], "device="); ok {
		f = f[:len(f)-1]
		opts = append(opts, OnDevice(dev))
		key = func(p string) string { return p + " device=" + dev }
	}
	var err error
	switch f[0] {
	case "open":
		var l *Lease
		if l, err = Open(abs(f[1]), opts...); err == nil {
			leases[key(f[1])] = l
			err = d.check(f[1], l)
		}
	case "open_many":
		var ps []string
		for _, p := range f[1:] {
			ps = append(ps, abs(p))
		}
		var ls []*Lease
		if ls, err = OpenMany(ps, opts...); err == nil {
			for i, l := range ls {
				leases[key(f[1+i])] = l
				if err = d.check(f[1+i], l); err != nil {
					break
				}
			}
		}
	case "close":
		l := leases[key(f[1])]
		delete(leases, key(f[1]))
		if l == nil {
			return fmt.Errorf("no lease of %s to close", f[1])
		}
		err = l.Close()
	case "stat":
		var r proto.Response
		d.mu.Lock()
		want := int64(len(d.files[f[1]]))
		d.mu.Unlock()
		if r, err = Stat(abs(f[1])); err == nil && r.Size != want {
			err = fmt.Errorf("stat size %d", r.Size)
		}
	case "wait": // wait P STATE,STATE MS
		var r proto.Response
		d.mu.Lock()
		want := int64(len(d.files[f[1]]))
		d.mu.Unlock()
		if r, err = Wait(abs(f[1]), strings.Split(f[2], ","), ms(f[3])); err == nil && r.Size != want {
			err = fmt.Errorf("wait size %d", r.Size)
		}
	case "wait_stat": // wait_stat KEY VALUE MS
		v, _ := strconv.ParseInt(f[2], 10, 64)
		err = WaitStat(d.root, f[1], v, ms(f[3]))
	default:
		return fmt.Errorf("unknown client call")
	}
	if st.ClientErr != "" {
		if err == nil || !errors.Is(err, proto.ParseErrno(st.ClientErr)) {
			return fmt.Errorf("got %v, want errno %s", err, st.ClientErr)
		}
		return nil
	}
	return err
}

// ms is a transcript's milliseconds.
func ms(s string) time.Duration {
	n, _ := strconv.ParseInt(s, 10, 64)
	return time.Duration(n) * time.Millisecond
}

func (d *fakeDaemon) check(rel string, l *Lease) error {
	b := make([]byte, l.Size())
	if _, err := l.ReadAt(b, 0); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if !bytes.Equal(b, d.files[rel]) {
		return fmt.Errorf("lease of %s: bytes differ from the file", rel)
	}
	return nil
}

// serve follows the transcript's daemon side.
func (d *fakeDaemon) serve() error {
	var c *net.UnixConn
	var r *proto.Reader
	for _, st := range d.tr.Steps {
		where := fmt.Sprintf("%s.jsonl:%d", d.tr.Name, st.Line)
		if st.ServerOnly {
			continue
		}
		switch st.Step {
		case "connect":
			d.ln.SetDeadline(time.Now().Add(10 * time.Second))
			nc, err := d.ln.AcceptUnix()
			if err != nil {
				return fmt.Errorf("%s: the client did not connect: %v", where, err)
			}
			c, r = nc, proto.NewReader(nc, 1<<20)
			defer nc.Close()
			continue
		case "change":
			d.mu.Lock()
			d.files[st.File] = golden.Content(st.Seed, st.Size)
			d.mu.Unlock()
			continue
		}
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		line, fds, err := r.Next()
		proto.CloseFDs(fds)
		if err != nil {
			return fmt.Errorf("%s: reading the client's request: %v", where, err)
		}
		got, err := golden.Decode(line)
		if err != nil {
			return fmt.Errorf("%s: %v", where, err)
		}
		want := golden.Fill(st.Send, d.b, &d.next).(map[string]any)
		wj, _ := json.Marshal(want)
		gj, _ := json.Marshal(got)
		if !bytes.Equal(wj, gj) {
			return fmt.Errorf("%s: the client sent %s, want %s", where, gj, wj)
		}
		ans := golden.Fill(st.Expect, d.b, &d.next).(map[string]any)
		mfds, err := d.memfds(st.Send, ans)
		if err != nil {
			return fmt.Errorf("%s: %v", where, err)
		}
		aj, _ := json.Marshal(ans)
		err = proto.Send(c, append(aj, '\n'), mfds)
		proto.CloseFDs(mfds)
		if err != nil && got["op"] == "release" && (errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET)) {
			err = nil // clients never wait for a release's answer: it may have closed since
		}
		if err != nil {
			return fmt.Errorf("%s: answering: %v", where, err)
		}
	}
	return nil
}

// fakeMount is mountinfo text with dir as a gdsfs mount of this
// process's euid.
func fakeMount(dir string) []byte {
	return []byte(fmt.Sprintf("22 1 8:1 / / rw - ext4 /dev/sda1 rw\n40 22 0:99 / %s rw - fuse.gdsfs /src rw,user_id=%d,group_id=0\n",
		escapeMount(dir), os.Geteuid()))
}

// memfds makes the descriptors an answer carries: per granted file, its
// chunks of the file's current bytes.
func (d *fakeDaemon) memfds(req, ans map[string]any) ([]int, error) {
	paths := golden.Paths(req)
	grants := []map[string]any{ans}
	if items, ok := ans["files"].([]any); ok {
		grants = nil
		for _, it := range items {
			grants = append(grants, it.(map[string]any))
		}
	}
	var fds []int
	for i, g := range grants {
		chunks, _ := g["chunks"].([]any)
		if len(chunks) == 0 {
			continue
		}
		d.mu.Lock()
		data := d.files[paths[i]]
		d.mu.Unlock()
		var off int64
		for _, ch := range chunks {
			n, _ := ch.(map[string]any)["len"].(json.Number).Int64()
			fd, err := unix.MemfdCreate("golden", unix.MFD_CLOEXEC)
			if err != nil {
				return nil, err
			}
			unix.Ftruncate(fd, n)
			if off < int64(len(data)) {
				unix.Pwrite(fd, data[off:min(off+n, int64(len(data)))], 0)
			}
			off += n
			fds = append(fds, fd)
		}
	}
	return fds, nil
}
