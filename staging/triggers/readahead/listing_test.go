package readahead

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gdsfs/gdsfs/internal/access"
	"github.com/gdsfs/gdsfs/internal/units"
)

func TestListBeneath(t *testing.T) {
	src := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(src, "d", "sub"), 0o755))
	must(os.WriteFile(filepath.Join(src, "d", "b.bin"), make([]byte, 10), 0o644))
	must(os.WriteFile(filepath.Join(src, "d", "a.bin"), make([]byte, 3), 0o600))
	must(os.Symlink("a.bin", filepath.Join(src, "d", "link")))
	must(os.WriteFile(filepath.Join(src, "top"), nil, 0o644))
	root, err := access.OpenRoot(src)
	must(err)
	defer root.Close()
	list := ListBeneath(root)
	got, err := list("d")
	must(err)
	slices.SortFunc(got, func(a, b Entry) int { return strings.Compare(a.Name, b.Name) })
	if want := []Entry{{"a.bin", 3}, {"b.bin", 10}}; !slices.Equal(got, want) {
		t.Fatalf("list d: %v, want %v (regular files only)", got, want)
	}
	if got, err := list("."); err != nil || !slices.Equal(got, []Entry{{"top", 0}}) {
		t.Fatalf("list .: %v, %v", got, err)
	}
	if _, err := list("../" + filepath.Base(src)); err == nil {
		t.Fatal("listed a directory above SOURCE")
	}
}

func TestOptionsValidate(t *testing.T) {
	for _, tc := range []struct {
		o   Options
		err string
	}{
		{Defaults(), ""},
		{Options{}, ""},
		{Options{Files: 0, Bytes: 0, TraceEntries: 100, Replay: "x"}, ""},
		{Options{Files: -1, Bytes: 1}, "staging.readahead_files: -1 is outside 0..256"},
		{Options{Files: MaxFiles + 1, Bytes: 1}, "staging.readahead_files: 257"},
		{Options{Files: 4, Bytes: -1}, "staging.readahead_bytes: negative"},
		{Options{Files: 4}, "staging.readahead_bytes: 0 while staging.readahead_files is 4"},
		{Options{TraceEntries: -1}, "staging.trace_entries: -1"},
		{Options{TraceEntries: MaxTraceEntries + 1}, "staging.trace_entries: "},
	} {
		err := tc.o.Validate()
		if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.HasPrefix(err.Error(), tc.err)) {
			t.Errorf("%+v: error %v, want %q", tc.o, err, tc.err)
		}
	}
	if d := Defaults(); d.Files != 4 || d.Bytes != 8*units.Size(1<<30) {
		t.Fatalf("defaults %+v", d)
	}
}
