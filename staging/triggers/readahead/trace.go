package readahead

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"
)

// TraceVersion is the version of the trace format this package writes
// and the only one it reads.
const TraceVersion = 1

// traceMagic starts a trace file's first line, followed by the version.
const traceMagic = "# gdsfs-trace "

// Trace is the order in which files were opened or leased through one
// mount. On disk (INTEGRATION.md, "Trace file"):
//
//	# gdsfs-trace 1
//	# mount: /mnt/data
//	# source: /data
//	# entries: 2
//	# dropped: 0
//	shards/shard-0000.bin
//	shards/shard-0001.bin
//
// One path per line, relative to the mount (= relative to SOURCE), in
// order. A path that holds a newline or a carriage return, starts with
// '#' or '"', has leading or trailing white space, or is not UTF-8 is
// written Go-quoted ("..." with \n, \x.. escapes). Lines starting with '#'
// are comments; "# key: value" comments carry mount, source, entries and
// dropped (entries older than the recorder's bound). Blank lines are
// ignored. A file without the first line is read as version 1 (a list
// written by hand); another version is refused.
type Trace struct {
	Mount, Source string
	Dropped       uint64
	Paths         []string
}

// WriteTo writes t in the trace format.
func (t *Trace) WriteTo(w io.Writer) (int64, error) {
	bw := bufio.NewWriter(w)
	cw := &countWriter{w: bw}
	fmt.Fprintf(cw, "%s%d\n", traceMagic, TraceVersion)
	fmt.Fprintf(cw, "# mount: %s\n# source: %s\n", oneLine(t.Mount), oneLine(t.Source))
	fmt.Fprintf(cw, "# entries: %d\n# dropped: %d\n", len(t.Paths), t.Dropped)
	for _, p := range t.Paths {
		if needsQuote(p) {
			p = strconv.Quote(p)
		}
		io.WriteString(cw, p+"\n")
	}
	if err := bw.Flush(); err != nil {
		return cw.n, err
	}
	return cw.n, cw.err
}

type countWriter struct {
	w   io.Writer
	n   int64
	err error
}

func (c *countWriter) Write(b []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	n, err := c.w.Write(b)
	c.n += int64(n)
	c.err = err
	return n, err
}

func oneLine(s string) string {
	return strings.NewReplacer("\n", `\n`, "\r", `\r`).Replace(s)
}

func needsQuote(p string) bool {
	return !utf8.ValidString(p) || strings.ContainsAny(p, "\n\r") ||
		strings.HasPrefix(p, "#") || strings.HasPrefix(p, `"`) || strings.TrimSpace(p) != p
}

// maxTraceLine bounds one line (a quoted PATH_MAX path fits).
const maxTraceLine = 64 << 10

// ReadTrace reads a trace; it refuses more than MaxTraceEntries paths, a
// path that is not clean and relative, and a version other than 1.
func ReadTrace(r io.Reader) (*Trace, error) {
	t := &Trace{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 4096), maxTraceLine)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSuffix(sc.Text(), "\r")
		switch {
		case strings.TrimSpace(line) == "":
		case strings.HasPrefix(line, "#"):
			if err := t.comment(line, n); err != nil {
				return nil, err
			}
		default:
			p, err := tracePath(line)
			if err != nil {
				return nil, fmt.Errorf("line %d: %w", n, err)
			}
			if len(t.Paths) >= MaxTraceEntries {
				return nil, fmt.Errorf("line %d: more than %d paths", n, MaxTraceEntries)
			}
			t.Paths = append(t.Paths, p)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return t, nil
}

// comment reads the version line and the "# key: value" lines.
func (t *Trace) comment(line string, n int) error {
	if v, ok := strings.CutPrefix(line, traceMagic); ok {
		if n != 1 {
			return fmt.Errorf("line %d: %q is allowed on the first line only", n, strings.TrimSpace(traceMagic))
		}
		if strings.TrimSpace(v) != strconv.Itoa(TraceVersion) {
			return fmt.Errorf("trace version %q; this gdsfs reads version %d", strings.TrimSpace(v), TraceVersion)
		}
		return nil
	}
	key, val, ok := strings.Cut(strings.TrimSpace(strings.TrimPrefix(line, "#")), ":")
	if !ok {
		return nil
	}
	val = strings.TrimSpace(val)
	switch strings.TrimSpace(key) {
	case "mount":
		t.Mount = val
	case "source":
		t.Source = val
	case "dropped":
		d, err := strconv.ParseUint(val, 10, 64)
		if err != nil {
			return fmt.Errorf("line %d: dropped: %q is not a count", n, val)
		}
		t.Dropped = d
	}
	return nil
}

// tracePath decodes one path line and checks it stays beneath the mount.
func tracePath(line string) (string, error) {
	p := line
	if strings.HasPrefix(line, `"`) {
		var err error
		if p, err = strconv.Unquote(line); err != nil {
			return "", fmt.Errorf("%s: not a Go-quoted path", line)
		}
	}
	if p == "" || strings.IndexByte(p, 0) >= 0 || path.IsAbs(p) || path.Clean(p) != p ||
		p == "." || p == ".." || strings.HasPrefix(p, "../") {
		return "", fmt.Errorf("%q: want a clean path relative to the mount", p)
	}
	return p, nil
}

// ReadTraceFile reads the trace in file; errors name the file.
func ReadTraceFile(file string) (*Trace, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	t, err := ReadTrace(f)
	if err != nil {
		return nil, fmt.Errorf("trace %s: %w", file, err)
	}
	return t, nil
}

// Recorder keeps the latest accesses in order, at most a bound of them;
// an access of the path recorded just before is not recorded again (an
// open followed by a lease of the same file is one entry). A nil Recorder
// records nothing.
type Recorder struct {
	mu      sync.Mutex
	ring    []string // guarded by mu; INVARIANT: len(ring) <= max
	max     int
	next    int    // where the next entry goes once ring is full
	last    string // the latest entry
	dropped uint64 // entries overwritten
}

// NewRecorder returns a recorder of at most n entries, nil if n <= 0.
func NewRecorder(n int) *Recorder {
	if n <= 0 {
		return nil
	}
	return &Recorder{max: n}
}

// Add records rel. It never blocks beyond a short lock.
func (t *Recorder) Add(rel string) {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.ring) > 0 && t.last == rel {
		return
	}
	t.last = rel
	if len(t.ring) < t.max {
		t.ring = append(t.ring, rel)
		return
	}
	t.ring[t.next] = rel
	t.next = (t.next + 1) % t.max
	t.dropped++
}

// Trace returns what was recorded, oldest first.
func (t *Recorder) Trace(mount, source string) *Trace {
	out := &Trace{Mount: mount, Source: source}
	if t == nil {
		return out
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	out.Paths = append(append(make([]string, 0, len(t.ring)), t.ring[t.next:]...), t.ring[:t.next]...)
	out.Dropped = t.dropped
	return out
}

// Reset forgets what was recorded.
func (t *Recorder) Reset() {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.ring, t.next, t.last, t.dropped = nil, 0, "", 0
}
