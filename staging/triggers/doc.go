// Package triggers holds what makes the cache stage a file that nobody
// asked for by a lease: the prefetch queue (queue.go) fed by
// .gdsfs/prefetch, warmup, the open trigger and the staging after reads;
// the staging after plain reads through the mount (afterread.go: the
// readers of each file, the wait for a reader's mapping and page cache
// after the last close, staging.defer_limit); the words the cache and a
// trigger share (core.go: Core, the cache's API for background loads;
// Background, a load's request with its trigger's hooks; Victim;
// Outcome; and AfterReadCore in afterread.go); and, in
// staging/triggers/readahead, the read-ahead planner and the executor of
// its plans.
//
// It works only through what the cache hands it (the functions Queue.Run
// is given, Core, AfterReadCore) and never imports staging: the cache
// declares what it calls (staging.Queue, staging.AfterRead) and the daemon
// wires each in (staging.Config.Queue, staging.Config.AfterRead); the
// cache implements Core and AfterReadCore.
//
// It never blocks a caller of Offer (a full queue drops the request) or
// of AfterRead's Opened and Closed (checks run on goroutines the cache
// waits for), never calls the cache with its own lock held, and never
// calls the cache from a method or hook the cache calls under its lock
// (Background's Admit, MayEvict, Observe; AfterRead's Reading, Deferred,
// Cancel, Stop, Open).
//
// # Locking
//
// Queue.mu guards the keys of the queued requests; AfterRead.mu the
// readers and the settling waits. Both are leaves: the cache calls
// Offer, Len and a request's forget, and AfterRead's Reading, Deferred,
// Cancel, Stop and Open, with its own lock (Cache.mu) held, so they are
// taken after Cache.mu or alone, and nothing is called with either held
// (AfterRead's Closed counts a last close down under AfterRead.mu, asks
// the cache Staged with it released, and takes it again to act on the
// answer).
package triggers
