package staging

import (
	"fmt"
	"path"
	"regexp"
	"strings"
)

// glob is a compiled include/exclude pattern: shell globs on the
// SOURCE-relative path where "*" and "?" stay within one directory, "**/"
// matches any number of directories ("**/*.bin" matches "a.bin" and
// "x/y/a.bin"), and a pattern without "/" matches the base name at any
// depth.
type glob struct {
	text     string
	re       *regexp.Regexp
	baseOnly bool
}

func compileGlob(p string) (glob, error) {
	if p == "" {
		return glob{}, fmt.Errorf("empty pattern")
	}
	var b strings.Builder
	b.WriteString("^")
	for i := 0; i < len(p); i++ {
		switch c := p[i]; {
		case strings.HasPrefix(p[i:], "**/"):
			b.WriteString("(?:.*/)?")
			i += 2
		case strings.HasPrefix(p[i:], "**"):
			b.WriteString(".*")
			i++
		case c == '*':
			b.WriteString("[^/]*")
		case c == '?':
			b.WriteString("[^/]")
		case c == '[':
			j := strings.IndexByte(p[i:], ']')
			if j < 0 {
				return glob{}, fmt.Errorf("pattern %q: unclosed [", p)
			}
			class := p[i+1 : i+j]
			if strings.HasPrefix(class, "!") {
				class = "^" + class[1:]
			}
			b.WriteString("[" + strings.ReplaceAll(class, `\`, `\\`) + "]")
			i += j
		default:
			b.WriteString(regexp.QuoteMeta(string(c)))
		}
	}
	b.WriteString("$")
	re, err := regexp.Compile(b.String())
	if err != nil {
		return glob{}, fmt.Errorf("pattern %q: %v", p, err)
	}
	return glob{text: p, re: re, baseOnly: !strings.Contains(p, "/")}, nil
}

func (g glob) match(rel string) bool {
	if g.baseOnly {
		return g.re.MatchString(path.Base(rel))
	}
	return g.re.MatchString(rel)
}

// filter decides by name which files are staged.
type filter struct {
	include, exclude []glob
}

func newFilter(o *Options) (*filter, error) {
	f := &filter{}
	for _, p := range o.Include {
		g, err := compileGlob(p)
		if err != nil {
			return nil, fmt.Errorf("staging.include: %w", err)
		}
		f.include = append(f.include, g)
	}
	for _, p := range o.Exclude {
		g, err := compileGlob(p)
		if err != nil {
			return nil, fmt.Errorf("staging.exclude: %w", err)
		}
		f.exclude = append(f.exclude, g)
	}
	return f, nil
}

// why says why rel is not to be staged, or "" if it is.
func (f *filter) why(rel string) string {
	for _, g := range f.exclude {
		if g.match(rel) {
			return "excluded by staging.exclude " + g.text
		}
	}
	if len(f.include) == 0 {
		return ""
	}
	for _, g := range f.include {
		if g.match(rel) {
			return ""
		}
	}
	return "not matched by staging.include"
}
