// Package units parses and prints the byte sizes and shares used in gdsfs
// configuration: "4MiB", "8GiB", "1.5GB", plain bytes, and for capacities a
// percentage of device memory ("50%").
//
// It never rounds silently: a value that does not parse is an error naming
// the text it was given.
package units

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Size is a number of bytes. In YAML and on the command line it is written
// as plain bytes or a number with a unit (KiB, MiB, GiB, TiB, KB, MB, GB, TB).
type Size int64

var unitFactors = []struct {
	suffix string
	factor float64
}{
	// Longest suffixes first so "MiB" is not read as "B".
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
	{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
	{"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"T", 1 << 40},
	{"B", 1},
}

// MaxSize is the largest size accepted: 1 EiB. No device or file is
// larger, and arithmetic on larger sizes (rounding up to an allocation
// granule, adding chunks) could overflow int64.
const MaxSize Size = 1 << 60

// ParseSize reads a size such as "4MiB", "1.5GB" or "4096". Whole numbers
// are read exactly; a size above MaxSize is an error, never a wrapped or
// rounded value.
func ParseSize(s string) (Size, error) {
	t := strings.TrimSpace(s)
	if t == "" {
		return 0, fmt.Errorf("bad size %q: empty", s)
	}
	num, factor := t, int64(1)
	for _, u := range unitFactors {
		if strings.HasSuffix(t, u.suffix) {
			num, factor = strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), int64(u.factor)
			break
		}
	}
	tooLarge := fmt.Errorf("bad size %q: too large (at most %d bytes, 1EiB)", s, int64(MaxSize))
	if n, err := strconv.ParseUint(num, 10, 64); err == nil {
		if n > uint64(MaxSize)/uint64(factor) {
			return 0, tooLarge
		}
		return Size(int64(n) * factor), nil
	} else if errors.Is(err, strconv.ErrRange) {
		return 0, tooLarge
	}
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
		if errors.Is(err, strconv.ErrRange) || math.IsInf(v, 1) {
			return 0, tooLarge
		}
		return 0, fmt.Errorf("bad size %q: want bytes or a number with a unit (KiB, MiB, GiB, TiB, KB, MB, GB, TB)", s)
	}
	if v < 0 {
		return 0, fmt.Errorf("bad size %q: negative", s)
	}
	b := v * float64(factor)
	if b > float64(MaxSize) {
		return 0, tooLarge
	}
	if b != math.Trunc(b) {
		return 0, fmt.Errorf("bad size %q: not a whole number of bytes", s)
	}
	return Size(b), nil
}

// String prints the size with the largest binary unit that divides it exactly.
func (s Size) String() string {
	for _, u := range []struct {
		suffix string
		factor int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if s != 0 && int64(s)%u.factor == 0 {
			return strconv.FormatInt(int64(s)/u.factor, 10) + u.suffix
		}
	}
	return strconv.FormatInt(int64(s), 10)
}

// UnmarshalYAML accepts a scalar size.
func (s *Size) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return fmt.Errorf("want a size such as 4MiB, got a %s", kindName(n.Kind))
	}
	v, err := ParseSize(n.Value)
	if err != nil {
		return err
	}
	*s = v
	return nil
}

// MarshalYAML prints the size in its shortest exact form.
func (s Size) MarshalYAML() (any, error) { return s.String(), nil }

// AutoSize is a Size or "auto" (0): the program picks it at start.
type AutoSize Size

// Auto says whether the program picks the size.
func (s AutoSize) Auto() bool { return s == 0 }

func (s AutoSize) String() string {
	if s == 0 {
		return "auto"
	}
	return Size(s).String()
}

// UnmarshalYAML accepts "auto" or a size (0 is not a size here: write
// auto).
func (s *AutoSize) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode && strings.TrimSpace(n.Value) == "auto" {
		*s = 0
		return nil
	}
	var v Size
	if err := v.UnmarshalYAML(n); err != nil {
		return fmt.Errorf("%v (or auto)", err)
	}
	if v == 0 {
		return fmt.Errorf("want a size above 0, or auto")
	}
	*s = AutoSize(v)
	return nil
}

// MarshalYAML prints "auto" or the size.
func (s AutoSize) MarshalYAML() (any, error) { return s.String(), nil }

// AutoCount is a whole number or "auto" (0): the program picks it at
// start.
type AutoCount int

// Auto says whether the program picks the count.
func (c AutoCount) Auto() bool { return c == 0 }

func (c AutoCount) String() string {
	if c == 0 {
		return "auto"
	}
	return strconv.Itoa(int(c))
}

// UnmarshalYAML accepts "auto" or a whole number above 0.
func (c *AutoCount) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode && strings.TrimSpace(n.Value) == "auto" {
		*c = 0
		return nil
	}
	v, err := strconv.Atoi(strings.TrimSpace(n.Value))
	if n.Kind != yaml.ScalarNode || err != nil || v <= 0 {
		return fmt.Errorf("want a whole number above 0 or auto, got %q", n.Value)
	}
	*c = AutoCount(v)
	return nil
}

// MarshalYAML prints "auto" or the number.
func (c AutoCount) MarshalYAML() (any, error) {
	if c == 0 {
		return "auto", nil
	}
	return int(c), nil
}

// Share is either an absolute size or a percentage of some total that is
// known only at run time (device memory, for capacities).
type Share struct {
	Bytes   Size
	Percent float64 // used when > 0; 0 < Percent <= 100
}

// ParseShare reads "50%" or a size.
func ParseShare(s string) (Share, error) {
	t := strings.TrimSpace(s)
	if p, ok := strings.CutSuffix(t, "%"); ok {
		v, err := strconv.ParseFloat(strings.TrimSpace(p), 64)
		if err != nil || math.IsNaN(v) || v <= 0 || v > 100 {
			return Share{}, fmt.Errorf("bad percentage %q: want a number in (0, 100] followed by %%", s)
		}
		return Share{Percent: v}, nil
	}
	b, err := ParseSize(t)
	if err != nil {
		return Share{}, err
	}
	return Share{Bytes: b}, nil
}

// Resolve returns the share in bytes of total.
func (s Share) Resolve(total int64) int64 {
	if s.Percent > 0 {
		return int64(float64(total) * s.Percent / 100)
	}
	return int64(s.Bytes)
}

func (s Share) String() string {
	if s.Percent > 0 {
		return strconv.FormatFloat(s.Percent, 'f', -1, 64) + "%"
	}
	return s.Bytes.String()
}

// UnmarshalYAML accepts "50%" or a size.
func (s *Share) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return fmt.Errorf("want a size or a percentage, got a %s", kindName(n.Kind))
	}
	v, err := ParseShare(n.Value)
	if err != nil {
		return err
	}
	*s = v
	return nil
}

// MarshalYAML prints the share as it would be written.
func (s Share) MarshalYAML() (any, error) { return s.String(), nil }

// HumanBytes prints n with a binary unit and two decimals, for reports.
func HumanBytes(n int64) string {
	f := float64(n)
	for _, u := range []string{"B", "KiB", "MiB", "GiB", "TiB"} {
		if math.Abs(f) < 1024 || u == "TiB" {
			if u == "B" {
				return fmt.Sprintf("%d B", n)
			}
			return fmt.Sprintf("%.2f %s", f, u)
		}
		f /= 1024
	}
	return ""
}

func kindName(k yaml.Kind) string {
	switch k {
	case yaml.MappingNode:
		return "mapping"
	case yaml.SequenceNode:
		return "list"
	case yaml.AliasNode:
		return "alias"
	default:
		return "value"
	}
}
