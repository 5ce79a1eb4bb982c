package proto

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		line string
		ok   bool
	}{
		{`{"op":"acquire","path":"a"}`, true},
		{`{"op":"acquire","path":"a","generation":3}`, true},
		{`{"op":"acquire"}`, false},
		{`{"op":"acquire","path":"a","lease":1}`, false},
		{`{"op":"acquire","path":"a","bogus":1}`, false},
		{`{"op":"acquire","path":"a"} {}`, false},
		{`{"op":"acquire_many","paths":["a","b"],"generations":[0,4]}`, true},
		{`{"op":"acquire_many","paths":[]}`, false},
		{`{"op":"acquire","path":"a","room_wait_ms":100}`, true},
		{`{"op":"acquire_many","paths":["a","b"],"room_wait_ms":1}`, true},
		{`{"op":"acquire","path":"a","room_wait_ms":-1}`, false},
		{`{"op":"acquire","path":"a","room_wait_ms":3600001}`, false},
		{`{"op":"stat","path":"a","room_wait_ms":100}`, false},
		{`{"op":"acquire","path":"a","resident":true,"identity":true}`, true},
		{`{"op":"acquire_many","paths":["a","b"],"resident":true,"identity":true}`, true},
		{`{"op":"stat","path":"a","resident":true}`, false},
		{`{"op":"wait","path":"a","until":["resident"],"timeout_ms":1,"identity":true}`, false},
		{`{"op":"acquire","path":"a","resident":1}`, false},
		{`{"op":"acquire","path":"a/../b"}`, false},
		{`{"op":"stat","path":"../etc/passwd"}`, false},
		{`{"op":"acquire_many","paths":["a","d/.."]}`, false},
		{`{"op":"wait","path":"..","until":["resident"],"timeout_ms":1}`, false},
		{`{"op":"acquire","path":"a..b/.../c."}`, true},
		{`{"op":"acquire_many","paths":["a"],"generations":[1,2]}`, false},
		{`{"op":"release","lease":7,"epoch":9}`, true},
		{`{"op":"release"}`, false},
		{`{"op":"stat","path":"x"}`, true},
		{"{\"op\":\"stat\",\"path\":\"m-\xff.bin\"}", false},
		{`{"op":"stat","path":"m-\udcff.bin"}`, false},
		{`{"op":"stat","path":"m-\ud83d.bin"}`, false},
		{`{"op":"stat","path":"m-\ud83d\u0041.bin"}`, false},
		{`{"op":"stat","path":"m-\ud83d\ude00.bin"}`, true},
		{`{"op":"stat","path":"m-\\udcff.bin"}`, true},
		{`{"op":"stat","path":"m-\ufffd.bin"}`, true},
		{`{"op":"report","event":"fallback","reason":"refused:EACCES"}`, true},
		{`{"op":"report","event":"fallback","reason":"has space"}`, false},
		{`{"op":"report","event":"fallback","reason":"` + strings.Repeat("x", MaxReason+1) + `"}`, false},
		{`{"op":"report","event":"other","reason":"x"}`, false},
		{`{"op":"hello","version":1}`, true},
		{`{"op":"wait","path":"a","until":["resident","failed"],"timeout_ms":100}`, true},
		{`{"op":"wait","path":"a","until":["loading"],"timeout_ms":100}`, false},
		{`{"op":"wait","path":"a","until":[],"timeout_ms":100}`, false},
		{`{"op":"wait","path":"a","until":["absent"]}`, false},
		{`{"op":"wait","path":"a","until":["absent"],"timeout_ms":3600001}`, false},
		{`{"op":"wait","until":["absent"],"timeout_ms":1}`, false},
		{`{"op":"wait","path":"a","until":["absent"],"timeout_ms":1,"key":"leases_active"}`, false},
		{`{"op":"wait_stat","key":"leases_active","value":0,"timeout_ms":5}`, true},
		{`{"op":"wait_stat","key":"lease_held_bytes","value":4096,"timeout_ms":5}`, true},
		{`{"op":"wait_stat","key":"leases_active","timeout_ms":5}`, false},
		{`{"op":"wait_stat","key":"leases_active","value":-1,"timeout_ms":5}`, false},
		{`{"op":"wait_stat","key":"ipc_requests","value":0,"timeout_ms":5}`, false},
		{`{"op":"wait_stat","key":"leases_active","value":0,"timeout_ms":5,"path":"a"}`, false},
		{`{"op":"fly"}`, false},
		{`not json`, false},
	} {
		_, err := DecodeRequest([]byte(tc.line))
		if (err == nil) != tc.ok {
			t.Errorf("%s: %v, want ok=%v", tc.line, err, tc.ok)
		}
		if err != nil && !errors.Is(err, syscall.EINVAL) {
			t.Errorf("%s: %v is not EINVAL", tc.line, err)
		}
	}
	long := `{"op":"stat","path":"` + strings.Repeat("a", MaxPath+1) + `"}`
	if _, err := DecodeRequest([]byte(long)); !errors.Is(err, syscall.ENAMETOOLONG) {
		t.Errorf("a path past MaxPath: %v", err)
	}
}

func TestCheckNames(t *testing.T) {
	for _, r := range []Request{{Op: OpStat, Path: "m-\xff.bin"}, {Op: OpAcquireMany, Paths: []string{"a", "m-\xff.bin"}}} {
		err := r.CheckNames()
		if !errors.Is(err, syscall.EILSEQ) || !strings.Contains(err.Error(), `m-\xff.bin`) {
			t.Errorf("%+v: %v, want EILSEQ naming m-\\xff.bin", r, err)
		}
	}
	if err := (&Request{Op: OpStat, Path: "m-\ufffd.bin"}).CheckNames(); err != nil {
		t.Errorf("a name with U+FFFD itself: %v", err)
	}
}

func TestStateIn(t *testing.T) {
	for _, tc := range []struct {
		state string
		until []string
		want  bool
	}{
		{"resident", []string{StateResident}, true},
		{"failed: out of memory", []string{StateFailed}, true},
		{"failed: out of memory", []string{StateResident, StateAbsent}, false},
		{"loading", WaitStates, false},
		{"absent", []string{StateAbsent}, true},
	} {
		if got := StateIn(tc.state, tc.until); got != tc.want {
			t.Errorf("StateIn(%q, %v) = %v", tc.state, tc.until, got)
		}
	}
}

func TestErrnoNames(t *testing.T) {
	for _, e := range []syscall.Errno{EACCES, ENOSPC, EDQUOT, ESTALE, E2BIG, ETIMEDOUT} {
		if ParseErrno(ErrnoName(e)) != e {
			t.Errorf("%v does not round-trip (%q)", e, ErrnoName(e))
		}
	}
	if ParseErrno("EBOGUS") != EIO || ErrnoName(0) != "EIO" {
		t.Error("unknown errnos are not EIO")
	}
	err := (&Response{Errno: "EACCES", Error: "no"}).Err()
	var e interface{ Errno() string }
	if !errors.Is(err, syscall.EACCES) || !errors.As(err, &e) || e.Errno() != "EACCES" {
		t.Errorf("answer error %v", err)
	}
}

func TestDecodeResponse(t *testing.T) {
	r, err := DecodeResponse([]byte(`{"ok":true,"epoch":1,"lease":2,"size":5,"chunks":[{"len":4096}],"newer_field":3}`))
	if err != nil || r.FDs() != 1 {
		t.Fatalf("%+v %v", r, err)
	}
	if _, err := DecodeResponse([]byte(`{"ok":true,"chunks":[{"len":0}]}`)); !errors.Is(err, syscall.EPROTO) {
		t.Fatalf("a zero-length chunk: %v", err)
	}
	r, _ = DecodeResponse([]byte(`{"ok":true,"files":[{"ok":true,"chunks":[{"len":1},{"len":1}]},{"ok":false,"errno":"ENOENT"},{"ok":true,"reuse":true}]}`))
	if r.FDs() != 2 {
		t.Fatalf("batch descriptors %d, want 2", r.FDs())
	}
	for _, line := range []string{`{"ok":true,"version":"1"}`, `{"ok":true,"release":123}`, `{"ok":true,"release":["0.2.0"]}`, "{\"ok\":true,\"release\":\"9\x1b]0;x\x07\nFAKE\"}"} {
		_, err := DecodeResponse([]byte(line))
		if !errors.Is(err, syscall.EPROTO) || strings.ContainsAny(err.Error(), "\x1b\x07\n") {
			t.Errorf("%q: %q, want EPROTO with control characters escaped", line, err)
		}
	}
}

func pair(t *testing.T) (*net.UnixConn, *net.UnixConn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "pair")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c.(*net.UnixConn)
	}
	return conn(fds[0]), conn(fds[1])
}

// TestManyDescriptors: an answer with more than MaxFDs descriptors goes
// in groups, and each line gets exactly its own, close-on-exec.
func TestManyDescriptors(t *testing.T) {
	a, b := pair(t)
	null, _ := os.Open("/dev/null")
	defer null.Close()
	fds := make([]int, 600)
	for i := range fds {
		fds[i] = int(null.Fd())
	}
	go func() {
		Send(a, []byte("{\"n\":0}\n"), nil)
		Send(a, []byte("{\"n\":600}\n"), fds)
		Send(a, []byte("{\"n\":1}\n"), fds[:1])
	}()
	r := NewReader(b, 1<<20)
	for _, want := range []int{0, 600, 1} {
		line, got, err := r.Next()
		if err != nil || string(line) != fmt.Sprintf(`{"n":%d}`, want) || len(got) != want {
			t.Fatalf("line %q: %d descriptors, %v; want %d", line, len(got), err, want)
		}
		for _, fd := range got {
			if fl, _ := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); fl&unix.FD_CLOEXEC == 0 {
				t.Fatal("a descriptor arrived without FD_CLOEXEC")
			}
		}
		CloseFDs(got)
	}
}

// TestLongLinesWithDescriptors: lines longer than the reader's first
// receive buffer, many times over, each with descriptors, and short ones
// between them: every line comes whole with exactly its own.
func TestLongLinesWithDescriptors(t *testing.T) {
	a, b := pair(t)
	null, _ := os.Open("/dev/null")
	defer null.Close()
	fd := int(null.Fd())
	sizes := []int{10, minRead - 1, minRead, minRead + 1, 3 * minRead, 10, maxRead + 7, 5 * maxRead, 10}
	line := func(i, n int) string {
		head := fmt.Sprintf(`{"i":%d,"pad":"`, i)
		return head + strings.Repeat("x", max(0, n-len(head)-2)) + `"}`
	}
	go func() {
		for i, n := range sizes {
			fds := make([]int, i%3)
			for k := range fds {
				fds[k] = fd
			}
			Send(a, []byte(line(i, n)+"\n"), fds)
		}
	}()
	r := NewReader(b, 1<<20)
	for i, n := range sizes {
		got, fds, err := r.Next()
		if err != nil || string(got) != line(i, n) || len(fds) != i%3 {
			t.Fatalf("line %d (%d bytes): %d bytes, %d descriptors, %v; want %d descriptors", i, n, len(got), len(fds), err, i%3)
		}
		CloseFDs(fds)
	}
}

// TestTruncatedDescriptors: a reader with no room for an answer's
// descriptors (RLIMIT_NOFILE, in a child process) gets ErrTruncated with
// the whole line, and the next line is read in step.
func TestTruncatedDescriptors(t *testing.T) {
	if os.Getenv("PROTO_TEST_CHILD") == "1" {
		truncChild()
		return
	}
	a, b := pair(t)
	f, err := b.File()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestTruncatedDescriptors$")
	cmd.Env = append(os.Environ(), "PROTO_TEST_CHILD=1")
	cmd.ExtraFiles = []*os.File{f}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	buf := make([]byte, 6)
	if _, err := out.Read(buf); err != nil || string(buf) != "ready\n" {
		t.Fatalf("child: %q %v", buf, err)
	}
	null, _ := os.Open("/dev/null")
	defer null.Close()
	fds := []int{int(null.Fd()), int(null.Fd()), int(null.Fd()), int(null.Fd())}
	Send(a, []byte("{\"first\":1}\n"), fds)
	Send(a, []byte("{\"second\":2}\n"), nil)
	rest, _ := io.ReadAll(out)
	cmd.Wait()
	if got := string(rest); got != "truncated {\"first\":1}\nnext {\"second\":2} (<nil>)\n" {
		t.Fatalf("child saw %q", got)
	}
}

func truncChild() {
	c, err := net.FileConn(os.NewFile(3, "conn"))
	if err != nil {
		os.Exit(2)
	}
	r := NewReader(c.(*net.UnixConn), 1<<20)
	// Fill the free numbers below the highest open descriptor, then leave
	// room for two: the answer's four do not fit.
	ents, _ := os.ReadDir("/proc/self/fd")
	highest := 0
	for _, e := range ents {
		var n int
		fmt.Sscan(e.Name(), &n)
		highest = max(highest, n)
	}
	for {
		fd, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			os.Exit(2)
		}
		if fd > highest {
			unix.Close(fd)
			break
		}
	}
	unix.Setrlimit(unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: uint64(highest + 3), Max: uint64(highest + 3)})
	fmt.Print("ready\n")
	line, fds, err := r.Next()
	CloseFDs(fds)
	if errors.Is(err, ErrTruncated) {
		fmt.Printf("truncated %s\n", line)
	} else {
		fmt.Printf("not truncated (%d descriptors, %v)\n", len(fds), err)
	}
	line, _, err = r.Next()
	fmt.Printf("next %s (%v)\n", line, err)

	os.Exit(0)
}

// The device field: acquire and acquire_many take it, nothing else; a
// device is letters, digits and dashes.
func TestRequestDevice(t *testing.T) {
	for _, tc := range []struct {
		r  Request
		ok bool
	}{
		{Request{Op: OpAcquire, Path: "a", Device: "GPU-5b3f0a1c-0000-1111-2222-333344445555"}, true},
		{Request{Op: OpAcquire, Path: "a", Device: "host1"}, true},
		{Request{Op: OpAcquireMany, Paths: []string{"a"}, Device: "0"}, true},
		{Request{Op: OpAcquire, Path: "a", Device: "host 1"}, false},
		{Request{Op: OpAcquire, Path: "a", Device: strings.Repeat("x", MaxDevice+1)}, false},
		{Request{Op: OpStat, Path: "a", Device: "host1"}, false},
		{Request{Op: OpRelease, Lease: 1, Device: "host1"}, false},
	} {
		if err := tc.r.Check(); (err == nil) != tc.ok {
			t.Errorf("%+v: %v", tc.r, err)
		}
	}
	for dev, want := range map[string]bool{"host": true, "host0": true, "host12": true, "hostx": false, "GPU-1": false, "": false} {
		if IsHost(dev) != want {
			t.Errorf("IsHost(%q) = %v", dev, !want)
		}
	}
}
