package readahead

// Use is what the cache knows of an entry it might evict to make room for
// a read-ahead load.
type Use struct {
	Rel string
	// LastUse is the tick of its latest open or lease (Runner.Opened and
	// Runner.Leased return it); for an entry read ahead and not used yet,
	// the Heat of its item; 0 if never.
	LastUse uint64
	Leased  bool // a lease holds it
	Loading bool // its load has not finished
}

// MayEvict is the one rule for making room for a read-ahead load: it may
// take free room, or the room of an entry that no lease holds, that is not
// loading, that is not itself planned (window), and that was last used
// before every item of window was planned: colder than every file the
// read-ahead brings in. A read-ahead load whose item left the window
// (empty window) may take free room only.
//
// The cache, needing room for a read-ahead load, walks its LRU from the
// cold end and takes the entries MayEvict allows until the load fits; if
// they are not enough it evicts nothing and declines (NoRoom). Demand
// loads keep their own rule (plain LRU, leased entries excepted): they may
// evict read-ahead files, which then count as wasted.
func MayEvict(c Use, window []Item) bool {
	if c.Leased || c.Loading || len(window) == 0 {
		return false
	}
	coldest := window[0].Heat
	for _, it := range window {
		if it.Rel == c.Rel {
			return false
		}
		coldest = min(coldest, it.Heat)
	}
	return c.LastUse < coldest
}
