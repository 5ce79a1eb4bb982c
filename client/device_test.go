package client

import (
	"errors"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gdsfs/gdsfs/proto"
)

func TestDefaultDevice(t *testing.T) {
	t.Cleanup(forgetDefaultDevice)
	for _, tc := range []struct {
		gdsfs, visible string // "-": unset
		want           string // "?": a UUID where a GPU answers, else ""
	}{
		{"host1", "GPU-a", "host1"},
		{"none", "GPU-a", ""},
		{"", "GPU-a", ""},
		{"-", "GPU-5b3f0a1c-0000-1111-2222-333344445555,GPU-b", "GPU-5b3f0a1c-0000-1111-2222-333344445555"},
		{"-", "", ""},
		{"-", "0", "?"},
	} {
		setOrUnset(t, "GDSFS_DEVICE", tc.gdsfs)
		setOrUnset(t, "CUDA_VISIBLE_DEVICES", tc.visible)
		forgetDefaultDevice()
		got := DefaultDevice()
		switch {
		case tc.want == "?" && got != "" && !strings.HasPrefix(got, "GPU-"):
			t.Errorf("%+v: %q, want a GPU UUID or none", tc, got)
		case tc.want != "?" && got != tc.want:
			t.Errorf("%+v: %q, want %q", tc, got, tc.want)
		}
		if d := deviceFor([]LeaseOption{OnDevice("3")}); d != "3" {
			t.Errorf("OnDevice(3) names %q", d)
		}
		if d := deviceFor(nil); d != got {
			t.Errorf("no option names %q, the default is %q", d, got)
		}
	}
}

func setOrUnset(t *testing.T, k, v string) {
	t.Setenv(k, v) // restored after the test
	if v == "-" {
		unsetenv(k)
	}
}

func unsetenv(k string) { _ = os.Unsetenv(k) }

// TestRoomWaitIsSent: RoomWait goes as room_wait_ms (whole milliseconds,
// at least 1) on Open, OpenMany and Conn.Acquire; without it none is sent.
func TestRoomWaitIsSent(t *testing.T) {
	refused := js(map[string]any{"ok": false, "epoch": 7, "errno": "ENOSPC", "error": "no room"})
	f := newScripted(t, func(n int, req proto.Request) reply {
		if req.Op == proto.OpAcquireMany {
			return reply{line: js(map[string]any{"ok": true, "epoch": 7, "files": []any{map[string]any{"ok": false, "errno": "ENOSPC", "error": "no room"}}})}
		}
		return reply{line: refused}
	})
	if _, err := Open(f.path("a"), RoomWait(250*time.Millisecond)); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("Open: %v, want ENOSPC", err)
	}
	if got := f.expect(proto.OpAcquire, 0); got.RoomWaitMS != 250 {
		t.Fatalf("Open sent room_wait_ms %d, want 250", got.RoomWaitMS)
	}
	if _, err := OpenMany([]string{f.path("b")}, RoomWait(time.Microsecond)); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("OpenMany: %v, want ENOSPC", err)
	}
	if got := f.expect(proto.OpAcquireMany, 0); got.RoomWaitMS != 1 {
		t.Fatalf("OpenMany sent room_wait_ms %d, want 1", got.RoomWaitMS)
	}
	c, err := Dial(f.sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Acquire("c", RoomWait(2*time.Second))
	if got := f.expect(proto.OpAcquire, 0); got.RoomWaitMS != 2000 {
		t.Fatalf("Conn.Acquire sent room_wait_ms %d, want 2000", got.RoomWaitMS)
	}
	c.Acquire("c")
	if got := f.expect(proto.OpAcquire, 0); got.RoomWaitMS != 0 {
		t.Fatalf("Conn.Acquire without RoomWait sent room_wait_ms %d", got.RoomWaitMS)
	}
}
