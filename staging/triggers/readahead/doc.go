// Package readahead predicts which files of SOURCE a reader will open next
// and plans their staging ahead of it, within a bounded window; it also
// records access traces and replays them.
//
// The cache feeds it what happened, in arrival order: a file was opened
// through the mount or leased (Access), and what became of each read-ahead
// request (Started, Loaded, Declined, Evicted). Every call returns a Plan:
// files to stage with read-ahead priority and earlier requests to cancel.
// Two sequences are recognised per directory: name order (the directory's
// sorted listing, ascending, by one reader or several moving through it
// together, e.g. DataLoader workers) and any order seen before (accesses recorded earlier in the
// daemon's life, or learnt from a trace). Random order predicts nothing.
//
// The Executor carries out the Plans through the cache's API for
// background loads (staging/triggers.Core, wired in through
// staging.Config.ReadAhead): it starts each load on a goroutine the cache
// waits for, cancels the loads that left the window, hands the cache
// MayEvict as each load's victim-choice hook, and tells the runner what
// the cache observes of each load (under the cache's lock, in event
// order).
//
// It must never block or do I/O on the caller's open path (Runner queues
// events and drops accesses rather than wait), never ask the cache to
// evict anything (MayEvict only says what a read-ahead load may displace),
// never call the cache from a hook the cache calls under its lock, and
// never plan more than Options.Bytes bytes at once, nor more files than
// Options.Files, or the files several readers of a directory spread over
// where that is more (MaxFiles in all; a replay with read-ahead off: one
// file at a time). It does not
// import staging: the cache calls it and hands it triggers.Core.
// INTEGRATION.md says where each call goes.
package readahead
