package readahead

import (
	"slices"
	"testing"
)

func TestMayEvict(t *testing.T) {
	window := []Item{{Rel: "d/a", Heat: 10}, {Rel: "d/b", Heat: 20}}
	for _, tc := range []struct {
		name   string
		c      Use
		window []Item
		want   bool
	}{
		{"colder than every planned file", Use{Rel: "x", LastUse: 9}, window, true},
		{"never used", Use{Rel: "x"}, window, true},
		{"leased", Use{Rel: "x", LastUse: 1, Leased: true}, window, false},
		{"loading", Use{Rel: "x", Loading: true}, window, false},
		{"used when the coldest planned file was planned", Use{Rel: "x", LastUse: 10}, window, false},
		{"hotter than one planned file", Use{Rel: "x", LastUse: 15}, window, false},
		{"used after every planned file was planned", Use{Rel: "x", LastUse: 25}, window, false},
		{"itself planned", Use{Rel: "d/a"}, window, false},
		{"no window: free room only", Use{Rel: "x"}, nil, false},
	} {
		if got := MayEvict(tc.c, tc.window); got != tc.want {
			t.Errorf("%s: MayEvict(%+v) = %v, want %v", tc.name, tc.c, got, tc.want)
		}
	}
}

// lru plays the cache's side of the rule, as INTEGRATION.md prescribes:
// a read-ahead load takes free room, else walks the LRU from the cold end
// taking what MayEvict allows, and evicts nothing if that is not enough.
type lru struct {
	capacity int
	entries  []*Use // coldest first
}

func (l *lru) find(rel string) int {
	return slices.IndexFunc(l.entries, func(u *Use) bool { return u.Rel == rel })
}

// use is a demand open or lease at tick at: the entry is staged if absent
// (evicting the coldest unleased entries) and moves to the hot end.
func (l *lru) use(rel string, at uint64, leased bool) {
	if i := l.find(rel); i >= 0 {
		l.entries = slices.Delete(l.entries, i, i+1)
	}
	for len(l.entries) >= l.capacity {
		i := slices.IndexFunc(l.entries, func(u *Use) bool { return !u.Leased })
		l.entries = slices.Delete(l.entries, i, i+1)
	}
	l.entries = append(l.entries, &Use{Rel: rel, LastUse: at, Leased: leased})
}

// readAhead stages it for read-ahead, or reports that there is no room.
func (l *lru) readAhead(it Item, window []Item) (victims []string, ok bool) {
	if len(l.entries) >= l.capacity {
		i := slices.IndexFunc(l.entries, func(u *Use) bool { return MayEvict(*u, window) })
		if i < 0 {
			return nil, false
		}
		victims = append(victims, l.entries[i].Rel)
		l.entries = slices.Delete(l.entries, i, i+1)
	}
	// Read ahead and unused: as if used when planned. Inserted by heat.
	j := slices.IndexFunc(l.entries, func(u *Use) bool { return u.LastUse > it.Heat })
	if j < 0 {
		j = len(l.entries)
	}
	l.entries = slices.Insert(l.entries, j, &Use{Rel: it.Rel, LastUse: it.Heat})
	return victims, true
}

func TestReadAheadNeverEvictsLeasedOrHotterFiles(t *testing.T) {
	c := newFake(t, Defaults(), Tuning{}, map[string][]Entry{"d": shards(40, 1)})
	cache := &lru{capacity: 7}
	var evicted, declined []string
	serve := func() {
		for _, rel := range c.staged {
			if !c.inflight[rel] {
				continue
			}
			it := itemOf(c.ra.Window(), rel)
			v, ok := cache.readAhead(it, c.ra.Window())
			if !ok {
				declined = append(declined, rel)
				c.decline(rel, NoRoom)
				continue
			}
			evicted = append(evicted, v...)
			c.load(rel)
		}
	}
	open := func(rel string) {
		at := c.tick()
		cache.use(rel, at, false)
		c.apply(c.ra.Access(Event{Rel: rel, Kind: Open, At: at}))
		serve()
	}
	cache.use("m/model", c.tick(), true) // leased by another consumer, coldest
	for _, rel := range seq("d", 0, 1, 2, 3) {
		open(rel)
	}
	// d/4 and d/5 took the free room, d/6 and d/7 the room of d/0 and d/1
	// (colder than the reader's fourth open, which planned them); never
	// m/model.
	if want := seq("d", 0, 1); !slices.Equal(evicted, want) || len(declined) != 0 {
		t.Fatalf("evicted %q, declined %q: want %q evicted, none declined", evicted, declined, want)
	}
	open("x/hot") // another reader, after the window was planned
	open(name("d", 4))
	// d/8 finds no room: m/model is leased, d/3 was opened when d/5..d/7
	// were planned, x/hot after. Plain LRU would have taken d/3, the file
	// the reader had just opened.
	if want := seq("d", 0, 1); !slices.Equal(evicted, want) || !slices.Equal(declined, seq("d", 8)) {
		t.Fatalf("evicted %q, declined %q: want %q evicted, d/f-0008 declined", evicted, declined, want)
	}
	for _, rel := range []string{"m/model", "x/hot", name("d", 3)} {
		if cache.find(rel) < 0 {
			t.Fatalf("%s was evicted", rel)
		}
	}
}

func itemOf(w []Item, rel string) Item {
	for _, it := range w {
		if it.Rel == rel {
			return it
		}
	}
	return Item{Rel: rel}
}
