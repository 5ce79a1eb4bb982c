package readahead

// maxOccurrences is how many positions of one name history keeps: enough
// to tell the pass a reader follows from the passes before it.
const maxOccurrences = 4

// history is one directory's recent accesses in order: the orders seen
// before. It is a ring of at most max names; positions are absolute (they
// keep counting as old entries fall off), so a position is valid while
// n-max <= pos < n. Not safe for concurrent use.
type history struct {
	max  int
	ring []string
	n    int64              // positions handed out; the next append gets n
	occ  map[string][]int64 // name -> its latest positions, oldest first
}

func newHistory(max int) *history {
	return &history{max: max, occ: map[string][]int64{}}
}

// valid reports whether position p is still held.
func (h *history) valid(p int64) bool {
	return p >= 0 && p < h.n && p >= h.n-int64(h.max)
}

// at returns the name at position p.
func (h *history) at(p int64) (string, bool) {
	if !h.valid(p) {
		return "", false
	}
	return h.ring[p%int64(h.max)], true
}

// occurrences returns name's held positions, oldest first. The slice is
// h's own: do not keep it across an append.
func (h *history) occurrences(name string) []int64 {
	return h.occ[name]
}

// recent reports whether name is among the last k entries.
func (h *history) recent(name string, k int) bool {
	o := h.occ[name]
	return len(o) > 0 && o[len(o)-1] >= h.n-int64(k)
}

// append records name at position n, dropping the oldest entry when full.
func (h *history) append(name string) {
	p := h.n
	if len(h.ring) < h.max {
		h.ring = append(h.ring, name)
	} else {
		i := p % int64(h.max)
		h.forget(h.ring[i], p-int64(h.max))
		h.ring[i] = name
	}
	o := append(h.occ[name], p)
	if len(o) > maxOccurrences {
		o = append(o[:0], o[len(o)-maxOccurrences:]...)
	}
	h.occ[name] = o
	h.n++
}

// forget drops position p of name (the entry falling off the ring).
func (h *history) forget(name string, p int64) {
	o := h.occ[name]
	if len(o) > 0 && o[0] == p {
		o = o[1:]
	}
	if len(o) == 0 {
		delete(h.occ, name)
		return
	}
	h.occ[name] = o
}
