package staging

import (
	"fmt"

	"github.com/gdsfs/gdsfs/proto"
)

// state is where an entry is in its life:
//
//	loading -> resident -> absent
//	loading -> failed
//	loading -> absent   (a background load cancelled or failed)
//
// An entry is made loading (life2_load.go, background.go, peers.go) and
// only moves forward, through move. Whether it is still attached
// (entry.detached), who started it (entry.bg: a background load) and
// whether a change or a reader cancelled its load (entry.changed,
// entry.yielding, entry.yielded) are kept beside the state: they are not
// states (a detached entry may be resident and leased, a background
// entry loading or resident).
type state uint8

const (
	stLoading state = iota
	stResident
	stFailed
	stAbsent
)

// The states as control files, xattrs, events and the protocol name them
// (proto's words, the one definition).
const (
	StateAbsent   = proto.StateAbsent
	StateLoading  = proto.StateLoading
	StateResident = proto.StateResident
	StateFailed   = proto.StateFailed
)

// String is the state's word, as Info.State, Event.State and the
// user.gdsfs.state xattr print it.
func (s state) String() string {
	switch s {
	case stLoading:
		return StateLoading
	case stResident:
		return StateResident
	case stFailed:
		return StateFailed
	case stAbsent:
		return StateAbsent
	}
	return fmt.Sprintf("state(%d)", uint8(s))
}

// moves are the legal transitions.
var moves = map[[2]state]bool{
	{stLoading, stResident}: true,
	{stLoading, stFailed}:   true,
	{stLoading, stAbsent}:   true,
	{stResident, stAbsent}:  true,
}

// moveLocked moves e to the state to; a move the life above does not
// allow is a defect in the package and panics. Cache.mu must be held.
func (e *entry) moveLocked(to state) {
	if !moves[[2]state{e.state, to}] {
		panic(fmt.Sprintf("staging: %s: entry moves from %s to %s", e.rel, e.state, to))
	}
	e.state = to
}
