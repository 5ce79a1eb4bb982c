// Package staging is the cache of staged files: identity-keyed entries
// (SOURCE-relative path plus dev, ino, size, mtime, ctime), their states
// (absent -> loading -> resident | failed), capacity and LRU eviction per
// device, leases that pin entries, single-flight loads, and the bounded
// best-effort prefetch queue. The loader splits a file into tasks and runs
// them on the cuFile path or the POSIX path (pread into two bounce buffers
// per worker, overlapping the copy to the device).
//
// Read it along an entry's life: cache.go (the Cache and its lock), then
// life1_lookup.go (a request finds or starts an entry), life2_load.go
// (room, allocation, the read onto the device, with loader.go's workers),
// life3_publish.go (the load's end made visible), life4_evict.go (the entry
// leaves). lease.go pins resident entries; events.go tells subscribers of
// every state change (Cache.Subscribe); readahead.go stages the files a
// reader will open next (internal/readahead predicts them), at a priority
// below every demand and within room no demand needs.
//
// It must never hand out stale bytes: an entry whose file changed is
// invalidated before anyone sees it again, and an entry is resident only
// after every copy into it completed. It never blocks a prefetch caller,
// never holds the cache lock across I/O or device calls, and never exceeds
// a device's capacity.
package staging
