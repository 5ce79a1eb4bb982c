package fs

import "testing"

// Control lines "PATH<TAB>key=value": the arguments split off only for
// controls that take them, and only when they look like key=value.
func TestSplitArgs(t *testing.T) {
	for _, tc := range []struct {
		text       string
		takes      bool
		path, args string
	}{
		{"a.bin\tgpus=0,1", true, "a.bin", "gpus=0,1"},
		{"dir/a b.bin\tgpus=all", true, "dir/a b.bin", "gpus=all"},
		{"a.bin\tgpus=0,1", false, "a.bin\tgpus=0,1", ""},
		{"a\tb.bin", true, "a\tb.bin", ""},
		{"a.bin\tGPUS=1", true, "a.bin\tGPUS=1", ""},
		{"a.bin", true, "a.bin", ""},
	} {
		p, a := splitArgs(tc.text, tc.takes)
		if p != tc.path || a != tc.args {
			t.Errorf("splitArgs(%q, %v) = %q, %q; want %q, %q", tc.text, tc.takes, p, a, tc.path, tc.args)
		}
	}
}
