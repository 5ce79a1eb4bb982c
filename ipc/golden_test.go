package ipc_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/internal/testkit/golden"
	"github.com/gdsfs/gdsfs/internal/units"
	"github.com/gdsfs/gdsfs/ipc"
	"github.com/gdsfs/gdsfs/proto"
)

// TestGoldenTranscripts replays proto/testdata against the real server
// (host backend): every answer must match its pattern and carry the
// descriptors it says, received close-on-exec. The Go and Python clients
// replay the same files against fake daemons.
func TestGoldenTranscripts(t *testing.T) {
	ts, err := golden.Load("../proto/testdata")
	if err != nil {
		t.Fatal(err)
	}
	for _, tr := range ts {
		t.Run(tr.Name, func(t *testing.T) { replayServer(t, tr) })
	}
}

func replayServer(t *testing.T, tr golden.Transcript) {
	su := tr.Setup
	f := start(t, su.Sharing, setup{chunk: su.ChunkSize, devices: su.HostDevices, opts: func(o *ipc.Options) {
		o.MaxRequest = units.Size(su.MaxRequest)
		if su.CacheHeadroom != "" {
			h, err := units.ParseShare(su.CacheHeadroom)
			if err != nil {
				t.Fatal(err)
			}
			o.CacheHeadroom = h
		}
	}})
	for rel, fi := range su.Files {
		f.write(t, rel, golden.Content(fi.Seed, fi.Size))
	}
	for _, d := range su.Dirs {
		os.MkdirAll(filepath.Join(f.src, d), 0o755)
	}
	for _, p := range su.FIFOs {
		if err := unix.Mkfifo(filepath.Join(f.src, p), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	b := golden.Bindings{}
	var next int64
	var r *raw
	for _, st := range tr.Steps {
		where := fmt.Sprintf("%s.jsonl:%d", tr.Name, st.Line)
		switch st.Step {
		case "connect":
			r = dial(t, f.srv.Path())
			continue
		case "change":
			f.write(t, st.File, golden.Content(st.Seed, st.Size))
			continue
		case "":
		default:
			t.Fatalf("%s: unknown step %q", where, st.Step)
		}
		line := []byte(st.SendRaw)
		if st.Send != nil {
			line, _ = json.Marshal(golden.Fill(st.Send, b, &next))
			line = append(line, '\n')
		}
		r.c.SetReadDeadline(time.Now().Add(20 * time.Second))
		if _, err := r.c.Write(line); err != nil {
			t.Fatalf("%s: send: %v", where, err)
		}
		ans, fds, err := r.r.Next()
		if err != nil {
			t.Fatalf("%s: answer: %v", where, err)
		}
		for _, fd := range fds {
			if fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != nil || fl&unix.FD_CLOEXEC == 0 {
				t.Errorf("%s: descriptor received without FD_CLOEXEC", where)
			}
		}
		proto.CloseFDs(fds)
		got, err := golden.Decode(ans)
		if err != nil {
			t.Fatalf("%s: %v: %s", where, err, ans)
		}
		if err := golden.Match(st.Expect, got, b, where); err != nil {
			t.Errorf("%v\n  answer: %s", err, ans)
		}
		if len(fds) != st.FDs {
			t.Errorf("%s: %d descriptors, want %d", where, len(fds), st.FDs)
		}
		if st.Closed {
			r.c.SetReadDeadline(time.Now().Add(10 * time.Second))
			if _, _, err := r.r.Next(); err == nil || os.IsTimeout(err) {
				t.Errorf("%s: the connection stayed open (%v)", where, err)
			}
		}
	}
	if tr.Name == "errors" {
		if st := f.srv.Stats(); st.AutoloadFallbacks != 1 || st.AutoloadFallbackReasons["refused:EACCES"] != 1 {
			t.Errorf("reports counted: %d %v", st.AutoloadFallbacks, st.AutoloadFallbackReasons)
		}
	}
}

var _ = syscall.EINVAL
