package loader

import "testing"

// Shares cover the file in whole tasks, one contiguous share per device.
func TestShares(t *testing.T) {
	for _, tc := range []struct {
		size, task int64
		n          int
	}{{100, 10, 2}, {101, 10, 3}, {1 << 20, 4096, 8}, {5, 10, 1}} {
		sp := Shares(tc.size, tc.task, tc.n)
		at := int64(0)
		for _, s := range sp {
			if s.Off != at || s.End < s.Off || (s.End != tc.size && s.End%tc.task != 0) {
				t.Errorf("%+v: shares %v", tc, sp)
			}
			at = s.End
		}
		if at != tc.size {
			t.Errorf("%+v: shares %v end at %d", tc, sp, at)
		}
	}
}
