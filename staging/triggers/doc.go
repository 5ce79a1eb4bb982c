// Package triggers holds what makes the cache stage a file that nobody
// asked for by a lease or a read: the prefetch queue (queue.go) fed by
// .gdsfs/prefetch, warmup, the open trigger and the staging after reads;
// the words the cache and a trigger share (core.go: Core, the cache's
// API for background loads; Background, a load's request with its
// trigger's hooks; Victim; Outcome); and, in staging/triggers/readahead,
// the read-ahead planner and the executor of its plans.
//
// It works only through what the cache hands it (the functions Queue.Run
// is given, Core) and never imports staging: the cache declares the
// Queue it feeds (staging.Queue) and the daemon wires one in
// (staging.Config.Queue); the cache implements Core.
//
// It never blocks a caller of Offer (a full queue drops the request),
// never calls the cache with its own lock held, and never calls the cache
// from a hook the cache calls under its lock (Background's Admit,
// MayEvict, Observe).
//
// # Locking
//
// Queue.mu guards the keys of the queued requests. It is a leaf: the
// cache calls Offer, Len and a request's forget with its own lock
// (Cache.mu) held, so Queue.mu is taken after Cache.mu or alone, and
// nothing is called with Queue.mu held.
package triggers
