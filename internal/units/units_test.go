package units

import (
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

func TestParseSize(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Size
		err  string
	}{
		{"4096", 4096, ""},
		{"4MiB", 4 << 20, ""},
		{"8GiB", 8 << 30, ""},
		{"1.5GB", 1500000000, ""},
		{" 2 KiB ", 2048, ""},
		{"16M", 16 << 20, ""},
		{"0", 0, ""},
		{"", 0, "empty"},
		{"4XB", 0, "want bytes"},
		{"-1MiB", 0, "negative"},
		{"0.5B", 0, "whole number"},
		{"1e30TiB", 0, "too large"},
		{"9223372036854775807", 0, "too large"}, // once a negative size
		{"9223372036854775808", 0, "too large"},
		{"99999999999999999999", 0, "too large"},
		{"8388608TiB", 0, "too large"},
		{"1e19", 0, "too large"},
		{"1e400", 0, "too large"},
		{"1152921504606846976", 1 << 60, ""},
		{"1152921504606846977", 0, "too large"},
		{"1048576TiB", 1 << 60, ""},
		{"9007199254740993", 9007199254740993, ""}, // exact, where a float64 is not
	} {
		got, err := ParseSize(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ParseSize(%q) error = %v, want one containing %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
}

func TestSizeRoundTrip(t *testing.T) {
	for _, s := range []Size{1, 1000, 4096, 1 << 20, 3 << 30, 5 << 40, 1<<20 + 1} {
		back, err := ParseSize(s.String())
		if err != nil || back != s {
			t.Errorf("%d printed %q parsed back as %d, %v", s, s.String(), back, err)
		}
	}
}

func TestShare(t *testing.T) {
	s, err := ParseShare("50%")
	if err != nil || s.Resolve(1000) != 500 || s.String() != "50%" {
		t.Fatalf("50%%: %+v %v", s, err)
	}
	s, err = ParseShare("2GiB")
	if err != nil || s.Resolve(1) != 2<<30 {
		t.Fatalf("2GiB: %+v %v", s, err)
	}
	for _, bad := range []string{"0%", "101%", "x%", "lots"} {
		if _, err := ParseShare(bad); err == nil {
			t.Errorf("ParseShare(%q) accepted", bad)
		}
	}
}

func TestYAML(t *testing.T) {
	var v struct {
		A Size  `yaml:"a"`
		B Share `yaml:"b"`
	}
	if err := yaml.Unmarshal([]byte("a: 4MiB\nb: 25%\n"), &v); err != nil {
		t.Fatal(err)
	}
	if v.A != 4<<20 || v.B.Percent != 25 {
		t.Fatalf("got %+v", v)
	}
	out, err := yaml.Marshal(v)
	if err != nil || string(out) != "a: 4MiB\nb: 25%\n" {
		t.Fatalf("marshal: %q %v", out, err)
	}
	if err := yaml.Unmarshal([]byte("a: [1]\n"), &v); err == nil {
		t.Fatal("list accepted as size")
	}
}

func TestAutoYAML(t *testing.T) {
	var v struct {
		S AutoSize  `yaml:"s"`
		C AutoCount `yaml:"c"`
	}
	if err := yaml.Unmarshal([]byte("s: auto\nc: auto\n"), &v); err != nil || !v.S.Auto() || !v.C.Auto() {
		t.Fatalf("auto: %+v %v", v, err)
	}
	if err := yaml.Unmarshal([]byte("s: 2MiB\nc: 12\n"), &v); err != nil || v.S != 2<<20 || v.C != 12 {
		t.Fatalf("values: %+v %v", v, err)
	}
	out, _ := yaml.Marshal(v)
	if string(out) != "s: 2MiB\nc: 12\n" {
		t.Fatalf("marshal: %q", out)
	}
	v.S, v.C = 0, 0
	if out, _ := yaml.Marshal(v); string(out) != "s: auto\nc: auto\n" {
		t.Fatalf("marshal auto: %q", out)
	}
	for _, bad := range []string{"s: 0\n", "s: x\n", "c: 0\n", "c: -1\n", "c: 1.5\n", "c: [1]\n"} {
		if err := yaml.Unmarshal([]byte(bad), &v); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
