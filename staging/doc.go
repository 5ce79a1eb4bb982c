// Package staging is the cache of staged files: identity-keyed entries
// (SOURCE-relative path plus dev, ino, size, mtime, ctime), their states
// (loading -> resident -> absent, loading -> failed; state.go), capacity
// and LRU eviction per device, leases that pin entries, single-flight
// loads, and which files wait in the prefetch queue. Each device's loader
// (staging/loader) splits a file into tasks and runs them on the cuFile
// path or the POSIX path (pread into two bounce buffers per worker,
// overlapping the copy to the device); it never sees the cache.
//
// It must never hand out stale bytes: an entry whose file changed is
// invalidated before anyone sees it again, and an entry is resident only
// after every copy into it completed. It never blocks a prefetch caller,
// never holds the cache lock across I/O or device calls, and never exceeds
// a device's capacity. It never imports the FUSE layer (fs): fs declares
// the few methods it calls (fs.Stager) and passes what it knows of an
// open as a staging.Reader.
//
// # Layout
//
// Read it along an entry's life:
//
//   - cache.go: the Cache, its lock and invariants, New and Close.
//   - state.go: an entry's typed state, its words (proto's) and its legal
//     moves; entry.go: the entry and what describes it (Info).
//   - life1_lookup.go: a request finds or starts an entry (ensure,
//     lookupOrStart); life2_load.go: room is reserved (admitLocked in
//     room.go) and the file read onto the device by the slot's
//     staging/loader (racy.go waits out the racy window first,
//     fdbudget.go counts descriptors); life3_publish.go: the load's end
//     made visible; life4_evict.go: the entry leaves (evicted,
//     invalidated, freed; unlockFree frees regions after the lock).
//   - lease.go: leases pin resident entries (and private copies);
//     replicas.go and peers.go: one entry per device, filled device to
//     device where peers allow.
//   - room.go: waiting for room, first come first served
//     (internal/fifo); slot.go: one device's capacity and LRU.
//   - prefetch.go: what the cache feeds the prefetch queue (Queue, kept
//     by staging/triggers) and which paths are queued, so that Attr reads
//     a queued file as loading and a request's end is told in order with
//     the state events; the queue's workers stage through stageQueued
//     and end a request through queuedDone.
//   - background.go: the API of the triggers that load files nobody
//     asked for (triggers.Core): loads at background priority, below
//     every demand and within room no demand needs (StartBackground),
//     cancelled by their trigger (CancelBackground) and promoted by the
//     first demand that meets them; the victims the trigger allows
//     (Background.MayEvict); what becomes of each load, told to its
//     trigger under Cache.mu in event order (Background.Observe); and
//     goroutines Close waits for (Go).
//   - readahead.go: the read-ahead planner (staging/triggers/readahead's
//     Runner: the clock that stamps entries, the access trace, the
//     replay), fed by opens and leases; its Executor, wired in through
//     Config.ReadAhead, carries out the plans through background.go.
//   - readers.go: the cache's side of the staging after the last reader
//     through the mount closes (staging/triggers.AfterRead, wired in
//     through Config.AfterRead, keeps the readers and decides when): the
//     API it stages through (triggers.AfterReadCore: StageAfterRead
//     queues a staging that yields to a reader, CancelYielding cancels
//     one a new reader meets, Staged, OpenSource, Done), and what the
//     core asks it under Cache.mu (Reading, Deferred, Cancel, Stop,
//     Open).
//   - handover.go: the resident entries handed to a successor daemon
//     (Handoff, Snapshot, ExportEntry) and taken over from a predecessor
//     (Adopt), resident as if loaded, with nothing read from SOURCE.
//   - events.go: every state change told to subscribers (Subscribe);
//     stats.go: counters and checkInvariantsLocked; watch.go: change
//     events (fanotify); filter.go, options.go, errors.go.
//
// Sub-packages, which never see *Cache:
//
//   - staging/loader: a device's load workers and the load paths
//     (cuFile, POSIX with pinned bounce buffers, O_DIRECT, the measured
//     rule sizing the workers, peer copies, split-ingest shares). The
//     core hands it a Request and gets back the path taken and why.
//   - staging/triggers: the prefetch queue and its workers (Config.Queue
//     wires it in, and its workers get stageQueued and queuedDone from
//     Queue.Run), the staging after reads (Config.AfterRead), and the
//     words the cache and a trigger share (triggers.Core,
//     triggers.AfterReadCore, Background, Outcome). It never imports
//     staging.
//   - staging/triggers/readahead: the read-ahead planner, its runner,
//     the access traces, and the executor that carries out the plans
//     through triggers.Core (Config.ReadAhead wires it in; it never
//     imports staging).
//
// # Locking
//
// Cache.mu guards the entries, their states, the slots' accounting, the
// counts of queued paths and the line of waiters for room.
// It is taken with c.lock and released with c.unlock (in tests every
// unlock checks the invariants first). The change watcher's drainMu is
// the only lock taken before it; every other lock of the package, of
// staging/triggers and of staging/triggers/readahead is a leaf taken
// after it or alone (events.mu, subscription.mu, counters.errMu,
// watcher.mu, the prefetch queue's Queue.mu, the staging after reads'
// AfterRead.mu, the read-ahead runner's and planner's locks, and
// whatever lock a trigger's Background hooks take: they are called under
// Cache.mu); no trigger calls the cache holding its own lock;
// staging/loader's locks are never taken with it held.
// The header of Cache (cache.go) lists them. Methods named ...Locked
// need Cache.mu held; no other method may be called with it held.
// Nothing blocks, does I/O or calls a device with Cache.mu held: regions
// are taken off the books under it and freed after it (unlockFree),
// loads run on the loader's goroutines, and subscribers are called from
// the events goroutine.
//
// # Error handling
//
// Errors name the file and what was being done, and wrap the errno the
// FUSE layer and the lease socket answer with (errors.go): EINVAL (not
// eligible, no such device), EFBIG (could never fit the capacity or the
// descriptor budget), ENOSPC (no room now, or the wait for room ran out;
// the latter also wraps ErrRoomWait), EAGAIN (the file kept changing
// under its loads, or its staging yielded to a reader), EBUSY (an evict
// of a leased or loading file), ENOENT (not staged). A cancelled context
// is returned wrapped as it is. A failed load leaves a failed entry with
// its reason (Info.State "failed: REASON") until the next request retries
// it; a region that fails to free is logged and counted (free_errors),
// never retried.
package staging
