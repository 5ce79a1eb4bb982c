package proto

import (
	"strconv"
	"unicode/utf8"
)

// checkText refuses a request line that is not UTF-8 or that escapes a
// lone surrogate (\udcff): encoding/json decodes both to U+FFFD, so the
// path in such a line would name another file than the one the client
// meant (one whose name has U+FFFD for the bad bytes).
func checkText(line []byte) error {
	if !utf8.Valid(line) {
		return Errorf(EINVAL, "malformed request: not UTF-8 (names that are not UTF-8 cannot be sent)")
	}
	for i := 0; i < len(line); i++ {
		if line[i] != '\\' || i+1 >= len(line) {
			continue
		}
		if line[i+1] != 'u' {
			i++ // an escaped character, never the start of another escape
			continue
		}
		r := hex4(line, i+2)
		switch {
		case r >= 0xd800 && r < 0xdc00 && i+12 <= len(line) && line[i+6] == '\\' && line[i+7] == 'u':
			if lo := hex4(line, i+8); lo >= 0xdc00 && lo < 0xe000 {
				i += 11
				continue
			}
			fallthrough
		case r >= 0xd800 && r < 0xe000:
			return Errorf(EINVAL, "malformed request: %s escapes a lone surrogate (names that are not UTF-8 cannot be sent)", line[i:i+6])
		}
		i += 5
	}
	return nil
}

// hex4 is the value of the 4 hex digits at b[i:], or -1.
func hex4(b []byte, i int) int {
	if i+4 > len(b) {
		return -1
	}
	v, err := strconv.ParseUint(string(b[i:i+4]), 16, 16)
	if err != nil {
		return -1
	}
	return int(v)
}

// CheckNames refuses, before it is sent, a request naming a path that is
// not UTF-8: JSON cannot carry it, and a daemon would read it as another
// name. The error (EILSEQ) names the path.
func (r *Request) CheckNames() error {
	for _, p := range append([]string{r.Path}, r.Paths...) {
		if !utf8.ValidString(p) {
			return Errorf(EILSEQ, "%q: the name is not UTF-8, which the lease protocol cannot carry", p)
		}
	}
	return nil
}
