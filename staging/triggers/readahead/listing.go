package readahead

import (
	"fmt"
	"os"
	"path"
	"sort"

	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/internal/access"
)

// Entry is one regular file of a directory listing.
type Entry struct {
	Name string // base name
	Size int64
}

// Lister lists the regular files of dir (relative to SOURCE; "." is
// SOURCE itself), in any order. The detector calls it on its own
// goroutine (never on an open path), once per directory and again when a
// name it is told about is missing from the listing it holds.
type Lister func(dir string) ([]Entry, error)

// ListBeneath lists directories beneath root with the daemon's
// credentials: names and sizes of regular files only (links, devices and
// directories are left out; a link's target is listed where it lives).
func ListBeneath(root *access.Root) Lister {
	return ListOpened(func(dir string) (*os.File, error) {
		return root.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0, access.Beneath)
	})
}

// ListOpened is ListBeneath for a cache that opens directories beneath
// SOURCE itself: open must resolve dir beneath SOURCE (openat2 with
// RESOLVE_BENEATH) and return it opened for reading.
func ListOpened(open func(dir string) (*os.File, error)) Lister {
	return func(dir string) ([]Entry, error) {
		d, err := open(dir)
		if err != nil {
			return nil, err
		}
		defer d.Close()
		names, err := d.Readdirnames(-1)
		if err != nil {
			return nil, fmt.Errorf("list %s: %w", dir, err)
		}
		out := make([]Entry, 0, len(names))
		for _, n := range names {
			var st unix.Stat_t
			if err := unix.Fstatat(int(d.Fd()), n, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				continue // gone since the listing
			}
			if st.Mode&unix.S_IFMT == unix.S_IFREG {
				out = append(out, Entry{Name: n, Size: st.Size})
			}
		}
		return out, nil
	}
}

// listing is a directory's regular files sorted by name.
type listing struct {
	names []string
	sizes []int64
	index map[string]int
}

func newListing(entries []Entry) *listing {
	sorted := append([]Entry(nil), entries...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Name < sorted[j].Name })
	l := &listing{index: make(map[string]int, len(sorted))}
	for _, e := range sorted {
		if _, dup := l.index[e.Name]; dup {
			continue
		}
		l.index[e.Name] = len(l.names)
		l.names = append(l.names, e.Name)
		l.sizes = append(l.sizes, e.Size)
	}
	return l
}

// size returns name's size and whether it is listed.
func (l *listing) size(name string) (int64, bool) {
	i, ok := l.index[name]
	if !ok {
		return 0, false
	}
	return l.sizes[i], true
}

// split returns the directory and base name of rel, a clean path relative
// to SOURCE.
func split(rel string) (dir, name string) {
	return path.Dir(rel), path.Base(rel)
}

// join is the inverse of split.
func join(dir, name string) string {
	if dir == "." {
		return name
	}
	return dir + "/" + name
}
