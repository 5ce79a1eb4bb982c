package client

import (
	"os"
	"strings"
	"testing"
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
