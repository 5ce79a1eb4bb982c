package readahead

import (
	"fmt"
	"slices"
	"sort"
	"testing"

	"github.com/gdsfs/gdsfs/internal/units"
)

// fakeCache plays the staging cache: it applies Plans, answers each
// request at once (auto) or when told, and opens files as a reader.
type fakeCache struct {
	t     *testing.T
	ra    *ReadAhead
	clock uint64
	auto  bool
	// lag > 0: a request starts loading at once and loads after lag more
	// accesses (a load takes as long as lag of the reader's accesses).
	lag      int
	accesses int
	due      map[string]int  // lag: rel -> the access count at which it loads
	inflight map[string]bool // asked for, not answered
	staged   []string        // every rel asked for, in order
	cancels  []string        // every rel cancelled, in order
	lists    map[string]int  // List calls per directory
	files    map[string][]Entry
}

func newFake(t *testing.T, opts Options, tune Tuning, files map[string][]Entry) *fakeCache {
	c := &fakeCache{t: t, inflight: map[string]bool{}, due: map[string]int{}, lists: map[string]int{}, files: files}
	c.ra = New(Config{Options: opts, Tuning: tune, List: func(dir string) ([]Entry, error) {
		c.lists[dir]++
		e, ok := c.files[dir]
		if !ok {
			return nil, fmt.Errorf("%s: no such directory", dir)
		}
		return slices.Clone(e), nil
	}})
	return c
}

// shards is a directory of n files named f-0000 ... of size each.
func shards(n int, size int64) []Entry {
	out := make([]Entry, n)
	for i := range out {
		out[i] = Entry{Name: fmt.Sprintf("f-%04d", i), Size: size}
	}
	return out
}

func name(dir string, i int) string { return join(dir, fmt.Sprintf("f-%04d", i)) }

func (c *fakeCache) tick() uint64 { c.clock++; return c.clock }

func (c *fakeCache) apply(p Plan) {
	c.t.Helper()
	for _, rel := range p.Cancel {
		delete(c.inflight, rel)
		delete(c.due, rel)
		c.cancels = append(c.cancels, rel)
	}
	for _, it := range p.Stage {
		if c.inflight[it.Rel] {
			c.t.Fatalf("%s asked for twice", it.Rel)
		}
		c.inflight[it.Rel] = true
		c.staged = append(c.staged, it.Rel)
	}
	c.check()
	if c.lag > 0 {
		for _, it := range p.Stage {
			c.ra.Started(it.Rel)
			c.due[it.Rel] = c.accesses + c.lag
		}
		return
	}
	if c.auto {
		for _, it := range p.Stage {
			if c.inflight[it.Rel] {
				c.load(it.Rel)
			}
		}
	}
}

// load answers the request for rel: started, then loaded.
func (c *fakeCache) load(rel string) {
	delete(c.inflight, rel)
	c.ra.Started(rel)
	c.apply(c.ra.Loaded(rel, c.tick()))
}

// decline answers the request for rel with Declined.
func (c *fakeCache) decline(rel string, why Why) {
	delete(c.inflight, rel)
	c.apply(c.ra.Declined(rel, why, c.tick()))
}

func (c *fakeCache) access(rel string, k Kind) {
	c.t.Helper()
	c.apply(c.ra.Access(Event{Rel: rel, Kind: k, At: c.tick()}))
	c.accesses++
	c.loadDue()
}

// loadDue answers, in name order, the lagged requests whose time came.
func (c *fakeCache) loadDue() {
	var due []string
	for rel, at := range c.due {
		if at <= c.accesses {
			due = append(due, rel)
		}
	}
	sort.Strings(due)
	for _, rel := range due {
		delete(c.due, rel)
		if c.inflight[rel] {
			c.load(rel)
		}
	}
}

func (c *fakeCache) open(rels ...string) {
	c.t.Helper()
	for _, rel := range rels {
		c.access(rel, Open)
	}
}

// window returns the rels planned now, sorted.
func (c *fakeCache) window() []string {
	var out []string
	for _, it := range c.ra.Window() {
		out = append(out, it.Rel)
	}
	sort.Strings(out)
	return out
}

// check verifies the bound and the bookkeeping after every Plan.
func (c *fakeCache) check() {
	c.t.Helper()
	r := c.ra
	r.mu.Lock()
	defer r.mu.Unlock()
	files, bytes := r.budget()
	n, sum, spread := 0, int64(0), 0
	for _, d := range r.dirs {
		for _, it := range d.window {
			if r.items[it.Rel] != it || it.owner != d {
				c.t.Fatalf("%s: in %s's window but not owned by it", it.Rel, d.dir)
			}
			n++
			sum += it.Size
		}
		// A window of several readers covers their spread; any other
		// holds at most its share of files.
		size := len(d.listOrEmpty().names)
		s := max(r.spread(&d.name, size), d.hist.carried)
		if len(d.window) > max(files, s) {
			c.t.Fatalf("%s's window holds %d files: over the bound of %d files and its readers' spread of %d", d.dir, len(d.window), files, s)
		}
		spread = max(spread, s)
	}
	if spread > 0 {
		files = MaxFiles
	}
	var fb int64
	for rel, it := range r.replay.flight {
		if r.items[rel] != it || !it.replay || it.owner != nil {
			c.t.Fatalf("%s: in the replay's flight but not marked so", rel)
		}
		n++
		fb += it.Size
	}
	if fb != r.replay.bytes {
		c.t.Fatalf("replay flight holds %d bytes, counted %d", fb, r.replay.bytes)
	}
	r.replay.wantMu.Lock()
	for rel := range r.replay.wanted {
		if !r.replay.pending[rel] && r.replay.flight[rel] == nil {
			c.t.Fatalf("%s: Wanted, but neither pending nor in the replay's flight", rel)
		}
	}
	r.replay.wantMu.Unlock()
	if n > files || sum+fb > bytes {
		c.t.Fatalf("window holds %d files, %d bytes: over the bound of %d files, %d bytes", n, sum+fb, files, bytes)
	}
}

func seq(dir string, idx ...int) []string {
	out := make([]string, len(idx))
	for i, x := range idx {
		out[i] = name(dir, x)
	}
	return out
}

func span(from, to int) []int {
	var out []int
	for i := from; i < to; i++ {
		out = append(out, i)
	}
	return out
}

func unitsSize(n int64) units.Size { return units.Size(n) }
