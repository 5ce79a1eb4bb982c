package readahead

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestTraceRoundTrip(t *testing.T) {
	in := &Trace{Mount: "/mnt/a b", Source: "/data", Dropped: 7, Paths: []string{
		"shards/shard-0000.bin", "plain name with spaces.bin", "#starts-with-hash", `"quoted"`,
		"new\nline", "carriage\rreturn", " leading", "trailing ", "bad-\xff-utf8", "ü/ß.bin",
	}}
	var b bytes.Buffer
	if _, err := in.WriteTo(&b); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(b.String(), "# gdsfs-trace 1\n# mount: /mnt/a b\n# source: /data\n# entries: 10\n# dropped: 7\nshards/shard-0000.bin\n") {
		t.Fatalf("trace starts %q", b.String()[:120])
	}
	out, err := ReadTrace(&b)
	if err != nil {
		t.Fatal(err)
	}
	if out.Mount != in.Mount || out.Source != in.Source || out.Dropped != in.Dropped || !slices.Equal(out.Paths, in.Paths) {
		t.Fatalf("read back %+v, want %+v", out, in)
	}
}

func TestReadTrace(t *testing.T) {
	for _, tc := range []struct {
		name, text string
		paths      []string
		err        string
	}{
		{"a list written by hand", "a/b\n\n  \nc\n", []string{"a/b", "c"}, ""},
		{"CRLF line ends", "# gdsfs-trace 1\r\na\r\nb\r\n", []string{"a", "b"}, ""},
		{"comments anywhere", "# gdsfs-trace 1\n# note\na\n# more: x\nb\n", []string{"a", "b"}, ""},
		{"another version", "# gdsfs-trace 2\na\n", nil, `trace version "2"; this gdsfs reads version 1`},
		{"version line not first", "a\n# gdsfs-trace 1\n", nil, "line 2: "},
		{"absolute path", "a\n/etc/passwd\n", nil, `line 2: "/etc/passwd": want a clean path relative to the mount`},
		{"climbing out", "../x\n", nil, "line 1: "},
		{"not clean", "a//b\n", nil, "line 1: "},
		{"dot", ".\n", nil, "line 1: "},
		{"bad quoting", "\"a\n", nil, "line 1: \"a: not a Go-quoted path"},
		{"NUL", "\"a\\x00b\"\n", nil, "line 1: "},
		{"bad dropped", "# dropped: many\n", nil, "line 1: dropped"},
	} {
		tr, err := ReadTrace(strings.NewReader(tc.text))
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s: error %v, want one containing %q", tc.name, err, tc.err)
		case tc.err == "" && !slices.Equal(tr.Paths, tc.paths):
			t.Errorf("%s: paths %q, want %q", tc.name, tr.Paths, tc.paths)
		}
	}
}

func TestReadTraceFileNamesTheFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "job.trace")
	if err := os.WriteFile(p, []byte("ok\n/abs\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadTraceFile(p); err == nil || !strings.HasPrefix(err.Error(), "trace "+p+": line 2: ") {
		t.Fatalf("error %v, want one naming %s and line 2", err, p)
	}
}

func TestRecorder(t *testing.T) {
	r := NewRecorder(3)
	for _, rel := range []string{"a", "a", "b", "c", "c", "d", "e"} {
		r.Add(rel)
	}
	tr := r.Trace("/mnt", "/src")
	if want := []string{"c", "d", "e"}; !slices.Equal(tr.Paths, want) || tr.Dropped != 2 {
		t.Fatalf("trace %q dropped %d, want %q dropped 2 (a repeated access is one entry)", tr.Paths, tr.Dropped, want)
	}
	var b bytes.Buffer
	tr.WriteTo(&b)
	back, err := ReadTrace(&b)
	if err != nil || !slices.Equal(back.Paths, tr.Paths) || back.Dropped != 2 || back.Mount != "/mnt" {
		t.Fatalf("read back %+v, %v", back, err)
	}
	r.Reset()
	r.Add("x")
	if tr := r.Trace("", ""); !slices.Equal(tr.Paths, []string{"x"}) || tr.Dropped != 0 {
		t.Fatalf("after Reset: %+v", tr)
	}
	var off *Recorder = NewRecorder(0)
	off.Add("a")
	off.Reset()
	if tr := off.Trace("/m", ""); len(tr.Paths) != 0 || tr.Mount != "/m" {
		t.Fatalf("a recorder of 0 entries recorded %+v", tr)
	}
}

func TestReplayedTraceFileDrivesTheWindow(t *testing.T) {
	in := &Trace{Paths: seq("d", 7, 3, 9, 1)}
	var b bytes.Buffer
	in.WriteTo(&b)
	tr, err := ReadTrace(&b)
	if err != nil {
		t.Fatal(err)
	}
	c := newFake(t, Options{Files: 2, Bytes: 1 << 30}, Tuning{}, map[string][]Entry{"d": shards(10, 1)})
	c.auto = true
	c.apply(c.ra.Replay(tr.Paths, c.tick()))
	if !slices.Equal(c.staged, in.Paths) {
		t.Fatalf("staged %q, want the trace's order %q", c.staged, in.Paths)
	}
}
